"""``GET /metrics``: this process's Prometheus metrics in the text format (``onward.metrics``).

No API key: a scraper reads counters and health gauges, never a run, an input or an
organisation's data; labels are lanes and outcomes only. Moved with ``ONWARD_METRICS=/path``,
removed with ``ONWARD_METRICS=off``. Left out of the OpenAPI document: it is not JSON and not
part of the API's contract.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from onward import metrics


def router() -> APIRouter:
    """The route at ``onward.metrics.path`` (none when metrics are off)."""
    routes = APIRouter()
    if metrics.path is None:
        return routes

    @routes.get(metrics.path, include_in_schema=False)
    async def scrape(request: Request) -> Response:
        """Rendered in the event loop (~1 ms): a thread would contend with the loop for the
        GIL for longer than the rendering takes (``onward.metrics.serving``)."""
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(REGISTRY), media_type=content_type)

    return routes
