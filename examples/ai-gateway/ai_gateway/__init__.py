"""An OpenAI-compatible chat gateway with a fake model, protected and metered by Tollgate through
tollgate_client (examples/ai-gateway/README.md)."""
