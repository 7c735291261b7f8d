"""Inference engines behind one interface; see :mod:`p2pinfer.engines.base`."""

from .base import (
    Engine,
    EngineError,
    EngineOverloadedError,
    GenerationParams,
    GenerationRecord,
    InvalidRequestError,
    PromptTooLongError,
    TokenChunk,
)
from .registry import available_engines, engine_class, load_engine

__all__ = [
    "Engine",
    "EngineError",
    "EngineOverloadedError",
    "GenerationParams",
    "GenerationRecord",
    "InvalidRequestError",
    "PromptTooLongError",
    "TokenChunk",
    "available_engines",
    "engine_class",
    "load_engine",
]
