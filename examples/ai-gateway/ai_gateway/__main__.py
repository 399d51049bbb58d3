"""`python -m ai_gateway` (from examples/ai-gateway, or `make ai-gateway`): the gateway on
AI_GATEWAY_HOST:AI_GATEWAY_PORT (127.0.0.1:9000, the upstream of deploy/ingress/nginx/example.conf)."""

import os

import uvicorn

from ai_gateway.app import GatewaySettings, create_app


def main() -> None:
    app = create_app(GatewaySettings.from_env())
    host = os.environ.get("AI_GATEWAY_HOST", "127.0.0.1")
    uvicorn.run(app, host=host, port=int(os.environ.get("AI_GATEWAY_PORT", "9000")), log_level="info")


if __name__ == "__main__":
    main()
