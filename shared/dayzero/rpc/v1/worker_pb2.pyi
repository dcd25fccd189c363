from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("worker_id", "role", "queued_tokens", "queued_requests", "running_requests", "kv_blocks_total", "kv_blocks_used", "kv_blocks_free", "open_leases", "ready")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    OPEN_LEASES_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    queued_tokens: int
    queued_requests: int
    running_requests: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    open_leases: int
    ready: bool
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ..., queued_tokens: _Optional[int] = ..., queued_requests: _Optional[int] = ..., running_requests: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., open_leases: _Optional[int] = ..., ready: _Optional[bool] = ...) -> None: ...

class WorkerRecord(_message.Message):
    __slots__ = ("worker_id", "role", "address", "http_address", "compat_hash", "transport", "load", "updated_at_unix", "ttl_seconds", "block_size", "unavailable")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HTTP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    COMPAT_HASH_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    address: str
    http_address: str
    compat_hash: str
    transport: str
    load: WorkerLoad
    updated_at_unix: float
    ttl_seconds: float
    block_size: int
    unavailable: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ..., address: _Optional[str] = ..., http_address: _Optional[str] = ..., compat_hash: _Optional[str] = ..., transport: _Optional[str] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., updated_at_unix: _Optional[float] = ..., ttl_seconds: _Optional[float] = ..., block_size: _Optional[int] = ..., unavailable: _Optional[str] = ...) -> None: ...

class HeartbeatReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("worker_id", "role")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    role: str
    def __init__(self, worker_id: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: str
    def __init__(self, role: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerRecord]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerRecord, _Mapping]]] = ...) -> None: ...
