"""The HTTP API (FastAPI): ``create_app(engine)``, and ``ApiServer`` to serve it with uvicorn
inside a running asyncio loop (``onward up``, ``onward demo``)."""

from onward.api.app import app_from_env, create_app
from onward.api.server import ApiServer

__all__ = ["ApiServer", "app_from_env", "create_app"]
