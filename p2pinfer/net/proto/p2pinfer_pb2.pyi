from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_UNSPECIFIED: _ClassVar[ErrorCode]
    BUSY: _ClassVar[ErrorCode]
    MODEL_MISMATCH: _ClassVar[ErrorCode]
    TOO_LARGE: _ClassVar[ErrorCode]
    DEADLINE: _ClassVar[ErrorCode]
    INTERNAL: _ClassVar[ErrorCode]
    BAD_REQUEST: _ClassVar[ErrorCode]
    HOP_LIMIT: _ClassVar[ErrorCode]

class Reachability(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REACHABILITY_UNKNOWN: _ClassVar[Reachability]
    REACHABILITY_PUBLIC: _ClassVar[Reachability]
    REACHABILITY_PRIVATE: _ClassVar[Reachability]

class DialBackStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DIAL_BACK_UNSPECIFIED: _ClassVar[DialBackStatus]
    DIAL_BACK_OK: _ClassVar[DialBackStatus]
    DIAL_BACK_FAILED: _ClassVar[DialBackStatus]
    DIAL_BACK_NO_MATCH: _ClassVar[DialBackStatus]
    DIAL_BACK_REFUSED: _ClassVar[DialBackStatus]
ERROR_UNSPECIFIED: ErrorCode
BUSY: ErrorCode
MODEL_MISMATCH: ErrorCode
TOO_LARGE: ErrorCode
DEADLINE: ErrorCode
INTERNAL: ErrorCode
BAD_REQUEST: ErrorCode
HOP_LIMIT: ErrorCode
REACHABILITY_UNKNOWN: Reachability
REACHABILITY_PUBLIC: Reachability
REACHABILITY_PRIVATE: Reachability
DIAL_BACK_UNSPECIFIED: DialBackStatus
DIAL_BACK_OK: DialBackStatus
DIAL_BACK_FAILED: DialBackStatus
DIAL_BACK_NO_MATCH: DialBackStatus
DIAL_BACK_REFUSED: DialBackStatus

class GenerationParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "top_p", "top_k", "has_seed", "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "grammar", "logprobs", "top_logprobs")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    HAS_SEED_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    has_seed: bool
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    grammar: str
    logprobs: bool
    top_logprobs: int
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., has_seed: _Optional[bool] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., grammar: _Optional[str] = ..., logprobs: _Optional[bool] = ..., top_logprobs: _Optional[int] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("version", "request_id", "token_ids", "params", "hops", "deadline_ms", "model_fingerprint", "predicted_match_tokens", "origin", "resumed_tokens", "prompt_text", "messages", "tools_json")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    HOPS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_MATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    RESUMED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    version: int
    request_id: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    params: GenerationParams
    hops: int
    deadline_ms: int
    model_fingerprint: str
    predicted_match_tokens: int
    origin: str
    resumed_tokens: int
    prompt_text: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools_json: str
    def __init__(self, version: _Optional[int] = ..., request_id: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[GenerationParams, _Mapping]] = ..., hops: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., predicted_match_tokens: _Optional[int] = ..., origin: _Optional[str] = ..., resumed_tokens: _Optional[int] = ..., prompt_text: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools_json: _Optional[str] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "piece", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    piece: bytes
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., piece: _Optional[bytes] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "piece", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    piece: bytes
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., piece: _Optional[bytes] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("token_ids", "text", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class GenerateDone(_message.Message):
    __slots__ = ("prompt_tokens", "reused_tokens", "generated_tokens", "ttft_s", "total_s", "finish_reason", "queue_s", "served_by")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    SERVED_BY_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    reused_tokens: int
    generated_tokens: int
    ttft_s: float
    total_s: float
    finish_reason: str
    queue_s: float
    served_by: str
    def __init__(self, prompt_tokens: _Optional[int] = ..., reused_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., ttft_s: _Optional[float] = ..., total_s: _Optional[float] = ..., finish_reason: _Optional[str] = ..., queue_s: _Optional[float] = ..., served_by: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    message: str
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("version", "chunk", "done", "error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    chunk: TokenChunk
    done: GenerateDone
    error: Error
    def __init__(self, version: _Optional[int] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., done: _Optional[_Union[GenerateDone, _Mapping]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class PeerRecord(_message.Message):
    __slots__ = ("peer_id", "addrs")
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    peer_id: str
    addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, peer_id: _Optional[str] = ..., addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class DigestPullRequest(_message.Message):
    __slots__ = ("version", "model_fingerprint", "max_peers")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MAX_PEERS_FIELD_NUMBER: _ClassVar[int]
    version: int
    model_fingerprint: str
    max_peers: int
    def __init__(self, version: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., max_peers: _Optional[int] = ...) -> None: ...

class DigestPullResponse(_message.Message):
    __slots__ = ("version", "digest", "load", "peers", "error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    digest: bytes
    load: LoadReport
    peers: _containers.RepeatedCompositeFieldContainer[PeerRecord]
    error: Error
    def __init__(self, version: _Optional[int] = ..., digest: _Optional[bytes] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ..., peers: _Optional[_Iterable[_Union[PeerRecord, _Mapping]]] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("node_id", "model_fingerprint", "queued_prefill_tokens", "prefill_ms_per_token", "active_requests", "busy", "epoch", "digest_version", "addrs", "slots", "free_slots", "slot_wait_ms", "reachability", "relay_addrs", "relay_service", "prefill_speed_unmeasured")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DIGEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    FREE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOT_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    REACHABILITY_FIELD_NUMBER: _ClassVar[int]
    RELAY_ADDRS_FIELD_NUMBER: _ClassVar[int]
    RELAY_SERVICE_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SPEED_UNMEASURED_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    model_fingerprint: str
    queued_prefill_tokens: int
    prefill_ms_per_token: float
    active_requests: int
    busy: bool
    epoch: int
    digest_version: int
    addrs: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    free_slots: int
    slot_wait_ms: float
    reachability: Reachability
    relay_addrs: _containers.RepeatedScalarFieldContainer[str]
    relay_service: bool
    prefill_speed_unmeasured: bool
    def __init__(self, node_id: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., queued_prefill_tokens: _Optional[int] = ..., prefill_ms_per_token: _Optional[float] = ..., active_requests: _Optional[int] = ..., busy: _Optional[bool] = ..., epoch: _Optional[int] = ..., digest_version: _Optional[int] = ..., addrs: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., free_slots: _Optional[int] = ..., slot_wait_ms: _Optional[float] = ..., reachability: _Optional[_Union[Reachability, str]] = ..., relay_addrs: _Optional[_Iterable[str]] = ..., relay_service: _Optional[bool] = ..., prefill_speed_unmeasured: _Optional[bool] = ...) -> None: ...

class GossipMessage(_message.Message):
    __slots__ = ("version", "digest", "load")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    version: int
    digest: bytes
    load: LoadReport
    def __init__(self, version: _Optional[int] = ..., digest: _Optional[bytes] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ...) -> None: ...

class ModelAnnouncement(_message.Message):
    __slots__ = ("version", "node_id", "model_fingerprint", "model_alias", "addrs")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_ALIAS_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    version: int
    node_id: str
    model_fingerprint: str
    model_alias: str
    addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., node_id: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., model_alias: _Optional[str] = ..., addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class DialBackRequest(_message.Message):
    __slots__ = ("version", "nonce", "addrs")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: bytes
    addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[bytes] = ..., addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class DialBackResponse(_message.Message):
    __slots__ = ("version", "status", "addr", "observed_ip", "message")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_IP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    version: int
    status: DialBackStatus
    addr: str
    observed_ip: str
    message: str
    def __init__(self, version: _Optional[int] = ..., status: _Optional[_Union[DialBackStatus, str]] = ..., addr: _Optional[str] = ..., observed_ip: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class DialBackProof(_message.Message):
    __slots__ = ("version", "nonce")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    version: int
    nonce: bytes
    def __init__(self, version: _Optional[int] = ..., nonce: _Optional[bytes] = ...) -> None: ...

class CheckRequest(_message.Message):
    __slots__ = ("version", "model_fingerprint", "prompt_ids", "answer_ids", "temperature")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    ANSWER_IDS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    version: int
    model_fingerprint: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    answer_ids: _containers.RepeatedScalarFieldContainer[int]
    temperature: float
    def __init__(self, version: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., answer_ids: _Optional[_Iterable[int]] = ..., temperature: _Optional[float] = ...) -> None: ...

class CheckScore(_message.Message):
    __slots__ = ("token_id", "logprob", "best_logprob", "mean_logprob", "var_logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BEST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    MEAN_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    VAR_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    best_logprob: float
    mean_logprob: float
    var_logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., best_logprob: _Optional[float] = ..., mean_logprob: _Optional[float] = ..., var_logprob: _Optional[float] = ...) -> None: ...

class CheckResponse(_message.Message):
    __slots__ = ("version", "scores", "evaluated_tokens", "error")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    EVALUATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    version: int
    scores: _containers.RepeatedCompositeFieldContainer[CheckScore]
    evaluated_tokens: int
    error: Error
    def __init__(self, version: _Optional[int] = ..., scores: _Optional[_Iterable[_Union[CheckScore, _Mapping]]] = ..., evaluated_tokens: _Optional[int] = ..., error: _Optional[_Union[Error, _Mapping]] = ...) -> None: ...
