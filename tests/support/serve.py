"""`tollgate serve` as the tests start it (ServeProcess): the CLI itself, with cheap password
hashes (tests/support/cheap_hashes.py). A process `serve --workers N` spawns imports this module
again as its main, so its workers and consumers hash cheaply too."""

from services.runtime.host.cli import app
from tests.support.cheap_hashes import use_cheapest_argon2

use_cheapest_argon2()

if __name__ == "__main__":
    app()
