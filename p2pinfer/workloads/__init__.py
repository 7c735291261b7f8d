"""Workloads shared by the simulator, the live demo and the benchmarks."""

from .base import (
    Popularity,
    Prompt,
    PromptEncoder,
    TimedRequest,
    WeightedChoice,
    parse_popularity,
    poisson_arrivals,
    timed,
)
from .conversations import ConversationWorkload
from .mmlu import MMLUQuestion, MMLUSubject, MMLUWorkload, five_shot_header, format_question, load_mmlu
from .tokenizer import WorkloadTokenizer, find_default_gguf, load_tokenizer
from .trace import TRACE_FORMAT, TRACE_VERSION, TraceError, read_trace, write_trace

__all__ = [
    "TRACE_FORMAT",
    "TRACE_VERSION",
    "ConversationWorkload",
    "MMLUQuestion",
    "MMLUSubject",
    "MMLUWorkload",
    "Popularity",
    "Prompt",
    "PromptEncoder",
    "TimedRequest",
    "TraceError",
    "WeightedChoice",
    "WorkloadTokenizer",
    "find_default_gguf",
    "five_shot_header",
    "format_question",
    "load_mmlu",
    "load_tokenizer",
    "parse_popularity",
    "poisson_arrivals",
    "read_trace",
    "timed",
    "write_trace",
]
