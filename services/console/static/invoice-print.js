// The printable invoice's Print button (the page allows no inline script).
document.getElementById("print")?.addEventListener("click", () => window.print());
