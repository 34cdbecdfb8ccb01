from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DraftShape(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_SHAPE_TREE: _ClassVar[DraftShape]
    DRAFT_SHAPE_CHAIN: _ClassVar[DraftShape]
    DRAFT_SHAPE_SIZED_TREE: _ClassVar[DraftShape]
    DRAFT_SHAPE_SIZED_CHAIN: _ClassVar[DraftShape]

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_CODE_UNSPECIFIED: _ClassVar[ErrorCode]
    ERROR_CODE_INVALID_ARGUMENT: _ClassVar[ErrorCode]
    ERROR_CODE_UNKNOWN_REQUEST: _ClassVar[ErrorCode]
    ERROR_CODE_REQUEST_ALREADY_ACTIVE: _ClassVar[ErrorCode]
    ERROR_CODE_RESOURCE_EXHAUSTED: _ClassVar[ErrorCode]
DRAFT_SHAPE_TREE: DraftShape
DRAFT_SHAPE_CHAIN: DraftShape
DRAFT_SHAPE_SIZED_TREE: DraftShape
DRAFT_SHAPE_SIZED_CHAIN: DraftShape
ERROR_CODE_UNSPECIFIED: ErrorCode
ERROR_CODE_INVALID_ARGUMENT: ErrorCode
ERROR_CODE_UNKNOWN_REQUEST: ErrorCode
ERROR_CODE_REQUEST_ALREADY_ACTIVE: ErrorCode
ERROR_CODE_RESOURCE_EXHAUSTED: ErrorCode

class TokenList(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("namespace", "step_id", "requests", "cost", "replica")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    step_id: int
    requests: _containers.RepeatedCompositeFieldContainer[RequestStep]
    cost: EngineCost
    replica: str
    def __init__(self, namespace: _Optional[str] = ..., step_id: _Optional[int] = ..., requests: _Optional[_Iterable[_Union[RequestStep, _Mapping]]] = ..., cost: _Optional[_Union[EngineCost, _Mapping]] = ..., replica: _Optional[str] = ...) -> None: ...

class EngineCost(_message.Message):
    __slots__ = ("tokens", "seconds", "padded", "base_tokens", "explore_every", "acceptance")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    PADDED_FIELD_NUMBER: _ClassVar[int]
    BASE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXPLORE_EVERY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    seconds: _containers.RepeatedScalarFieldContainer[float]
    padded: bool
    base_tokens: int
    explore_every: int
    acceptance: float
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., seconds: _Optional[_Iterable[float]] = ..., padded: _Optional[bool] = ..., base_tokens: _Optional[int] = ..., explore_every: _Optional[int] = ..., acceptance: _Optional[float] = ...) -> None: ...

class RequestStep(_message.Message):
    __slots__ = ("request_id", "prompt", "new_tokens", "accepted_last", "finished", "budget", "reset", "group", "shape", "temperature", "offset")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_LAST_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: TokenList
    new_tokens: _containers.RepeatedScalarFieldContainer[int]
    accepted_last: int
    finished: bool
    budget: int
    reset: bool
    group: str
    shape: DraftShape
    temperature: float
    offset: int
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Union[TokenList, _Mapping]] = ..., new_tokens: _Optional[_Iterable[int]] = ..., accepted_last: _Optional[int] = ..., finished: _Optional[bool] = ..., budget: _Optional[int] = ..., reset: _Optional[bool] = ..., group: _Optional[str] = ..., shape: _Optional[_Union[DraftShape, str]] = ..., temperature: _Optional[float] = ..., offset: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("step_id", "roots", "sizes", "tokens", "parents", "scores", "errors", "held", "error")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ROOTS_FIELD_NUMBER: _ClassVar[int]
    SIZES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    roots: _containers.RepeatedScalarFieldContainer[int]
    sizes: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    parents: _containers.RepeatedScalarFieldContainer[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    errors: _containers.RepeatedCompositeFieldContainer[RequestError]
    held: _containers.RepeatedScalarFieldContainer[int]
    error: RequestError
    def __init__(self, step_id: _Optional[int] = ..., roots: _Optional[_Iterable[int]] = ..., sizes: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[int]] = ..., parents: _Optional[_Iterable[int]] = ..., scores: _Optional[_Iterable[float]] = ..., errors: _Optional[_Iterable[_Union[RequestError, _Mapping]]] = ..., held: _Optional[_Iterable[int]] = ..., error: _Optional[_Union[RequestError, _Mapping]] = ...) -> None: ...

class RequestError(_message.Message):
    __slots__ = ("code", "field", "message", "index")
    CODE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    code: ErrorCode
    field: str
    message: str
    index: int
    def __init__(self, code: _Optional[_Union[ErrorCode, str]] = ..., field: _Optional[str] = ..., message: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class IngestRequest(_message.Message):
    __slots__ = ("namespace", "documents")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    documents: _containers.RepeatedCompositeFieldContainer[TokenList]
    def __init__(self, namespace: _Optional[str] = ..., documents: _Optional[_Iterable[_Union[TokenList, _Mapping]]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("namespace", "documents", "tokens")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    documents: int
    tokens: int
    def __init__(self, namespace: _Optional[str] = ..., documents: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("namespace", "active_requests", "trie_nodes", "memory_bytes", "memory_budget_bytes", "evicted_nodes", "tokens_ingested", "drafts", "draft_nodes", "accepted_reported", "steps_reported", "trie_bytes_per_node", "active_groups", "group_bytes", "sized_away", "accepted_cross_replica", "replicas")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TRIE_NODES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    EVICTED_NODES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_INGESTED_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_NODES_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_REPORTED_FIELD_NUMBER: _ClassVar[int]
    STEPS_REPORTED_FIELD_NUMBER: _ClassVar[int]
    TRIE_BYTES_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_BYTES_FIELD_NUMBER: _ClassVar[int]
    SIZED_AWAY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_CROSS_REPLICA_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    active_requests: int
    trie_nodes: int
    memory_bytes: int
    memory_budget_bytes: int
    evicted_nodes: int
    tokens_ingested: int
    drafts: int
    draft_nodes: int
    accepted_reported: int
    steps_reported: int
    trie_bytes_per_node: float
    active_groups: int
    group_bytes: int
    sized_away: int
    accepted_cross_replica: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStats]
    def __init__(self, namespace: _Optional[str] = ..., active_requests: _Optional[int] = ..., trie_nodes: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., memory_budget_bytes: _Optional[int] = ..., evicted_nodes: _Optional[int] = ..., tokens_ingested: _Optional[int] = ..., drafts: _Optional[int] = ..., draft_nodes: _Optional[int] = ..., accepted_reported: _Optional[int] = ..., steps_reported: _Optional[int] = ..., trie_bytes_per_node: _Optional[float] = ..., active_groups: _Optional[int] = ..., group_bytes: _Optional[int] = ..., sized_away: _Optional[int] = ..., accepted_cross_replica: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStats, _Mapping]]] = ...) -> None: ...

class ReplicaStats(_message.Message):
    __slots__ = ("replica", "accepted_reported", "accepted_cross_replica")
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_REPORTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_CROSS_REPLICA_FIELD_NUMBER: _ClassVar[int]
    replica: str
    accepted_reported: int
    accepted_cross_replica: int
    def __init__(self, replica: _Optional[str] = ..., accepted_reported: _Optional[int] = ..., accepted_cross_replica: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("version", "vocab_size", "max_budget", "max_ngram", "max_requests_per_step", "max_message_bytes", "max_namespaces", "namespace_memory_budget_bytes", "namespaces")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_NGRAM_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUESTS_PER_STEP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_MEMORY_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NAMESPACES_FIELD_NUMBER: _ClassVar[int]
    version: str
    vocab_size: int
    max_budget: int
    max_ngram: int
    max_requests_per_step: int
    max_message_bytes: int
    max_namespaces: int
    namespace_memory_budget_bytes: int
    namespaces: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_budget: _Optional[int] = ..., max_ngram: _Optional[int] = ..., max_requests_per_step: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., max_namespaces: _Optional[int] = ..., namespace_memory_budget_bytes: _Optional[int] = ..., namespaces: _Optional[_Iterable[str]] = ...) -> None: ...
