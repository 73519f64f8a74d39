"""The HTTP API's published descriptions (its OpenAPI document) speak to its users: no
internal requirement numbers (R1-R18, B1-B5) in any summary or description."""

from __future__ import annotations

import json
import re

from onward.api.app import create_app


def test_the_openapi_document_cites_no_internal_requirement_numbers() -> None:
    text = json.dumps(create_app().openapi())
    assert re.findall(r".{30}\b[RB]\d{1,2}[a-z]?\b.{10}", text) == []
