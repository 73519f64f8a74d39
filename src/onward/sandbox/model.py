"""Sandbox model provider: deterministic "generations" that cost money on every call.

``POST /model/generate`` returns text derived only from the prompt (so tests can assert on it)
and a cost computed from token counts. There is no idempotency: every call is new work and a new
ledger entry, which is what makes retries of model steps visible in cost.
"""

from __future__ import annotations

import hashlib
import math
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from onward.sandbox.common import Account, IdempotencyKey, new_id
from onward.sandbox.ledger import Ledger, get_ledger

router = APIRouter(prefix="/model", tags=["model"])

MODEL_NAME = "sandbox-1"
# Dollars per token; the shape (output dearer than input) is what matters, not the numbers.
USD_PER_INPUT_TOKEN = 3e-6
USD_PER_OUTPUT_TOKEN = 15e-6
_WORDS = (
    "thanks",
    "for",
    "reaching",
    "out",
    "we",
    "will",
    "follow",
    "up",
    "shortly",
    "about",
    "your",
    "request",
    "and",
    "share",
    "the",
    "details",
    "with",
    "the",
    "team",
    "today",
    "please",
    "let",
    "us",
    "know",
    "if",
    "anything",
    "changes",
    "soon",
)


class GenerateIn(BaseModel):
    prompt: str
    max_tokens: int = Field(256, ge=1, le=8192)


def generate_text(prompt: str, max_tokens: int) -> str:
    """Deterministic pseudo-text: words picked by the prompt's hash, at most ``max_tokens``."""
    digest = hashlib.sha256(prompt.encode()).digest()
    count = min(max_tokens, 8 + digest[0] % 24)
    return " ".join(_WORDS[digest[i % len(digest)] % len(_WORDS)] for i in range(count))


def count_tokens(text: str) -> int:
    # Roughly four characters per token, like common BPE tokenizers on English.
    return max(1, math.ceil(len(text) / 4))


LedgerDep = Annotated[Ledger, Depends(get_ledger)]


@router.post("/generate")
async def generate(
    payload: GenerateIn,
    account: Account,
    ledger: LedgerDep,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    text = generate_text(payload.prompt, payload.max_tokens)
    tokens_in = count_tokens(payload.prompt)
    tokens_out = len(text.split())
    generation_id = new_id("gen")
    result = {
        "id": generation_id,
        "model": MODEL_NAME,
        "text": text,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "cost_usd": round(tokens_in * USD_PER_INPUT_TOKEN + tokens_out * USD_PER_OUTPUT_TOKEN, 8),
    }
    ledger.append(
        provider="model",
        account=account,
        op="generate",
        idempotency_key=idempotency_key,  # recorded for tracing only; never used to dedup
        metadata={"tokens_in": tokens_in, "tokens_out": tokens_out},
        request=payload.model_dump(),
        response_id=generation_id,
    )
    return result
