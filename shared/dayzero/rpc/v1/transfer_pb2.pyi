from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KVCompat(_message.Message):
    __slots__ = ("version", "hash", "model_id", "dtype", "block_size", "kv_layout", "tp_size", "num_layers", "num_kv_heads", "head_dim", "sliding_window")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    version: int
    hash: str
    model_id: str
    dtype: str
    block_size: int
    kv_layout: str
    tp_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int
    def __init__(self, version: _Optional[int] = ..., hash: _Optional[str] = ..., model_id: _Optional[str] = ..., dtype: _Optional[str] = ..., block_size: _Optional[int] = ..., kv_layout: _Optional[str] = ..., tp_size: _Optional[int] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., sliding_window: _Optional[int] = ...) -> None: ...

class KVRegion(_message.Message):
    __slots__ = ("layer", "kind", "base_address", "block_bytes", "num_blocks", "device_id")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    BASE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    layer: int
    kind: str
    base_address: int
    block_bytes: int
    num_blocks: int
    device_id: int
    def __init__(self, layer: _Optional[int] = ..., kind: _Optional[str] = ..., base_address: _Optional[int] = ..., block_bytes: _Optional[int] = ..., num_blocks: _Optional[int] = ..., device_id: _Optional[int] = ...) -> None: ...

class KVReceiverInfo(_message.Message):
    __slots__ = ("transport", "compat", "endpoint", "agent_name", "agent_metadata", "memory_type", "regions")
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    COMPAT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    AGENT_NAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_METADATA_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TYPE_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    transport: str
    compat: KVCompat
    endpoint: str
    agent_name: str
    agent_metadata: bytes
    memory_type: str
    regions: _containers.RepeatedCompositeFieldContainer[KVRegion]
    def __init__(self, transport: _Optional[str] = ..., compat: _Optional[_Union[KVCompat, _Mapping]] = ..., endpoint: _Optional[str] = ..., agent_name: _Optional[str] = ..., agent_metadata: _Optional[bytes] = ..., memory_type: _Optional[str] = ..., regions: _Optional[_Iterable[_Union[KVRegion, _Mapping]]] = ...) -> None: ...

class LayerBlocks(_message.Message):
    __slots__ = ("block_ids",)
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class KVAllocation(_message.Message):
    __slots__ = ("request_id", "lease_id", "num_tokens", "layers", "expires_at_unix")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_UNIX_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_id: str
    num_tokens: int
    layers: _containers.RepeatedCompositeFieldContainer[LayerBlocks]
    expires_at_unix: float
    def __init__(self, request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., num_tokens: _Optional[int] = ..., layers: _Optional[_Iterable[_Union[LayerBlocks, _Mapping]]] = ..., expires_at_unix: _Optional[float] = ...) -> None: ...

class KVChunk(_message.Message):
    __slots__ = ("request_id", "lease_id", "compat", "region", "dst_block", "data", "last")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPAT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    DST_BLOCK_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_id: str
    compat: KVCompat
    region: int
    dst_block: int
    data: bytes
    last: bool
    def __init__(self, request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., compat: _Optional[_Union[KVCompat, _Mapping]] = ..., region: _Optional[int] = ..., dst_block: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ...) -> None: ...

class KVPushReply(_message.Message):
    __slots__ = ("bytes", "blocks")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    blocks: int
    def __init__(self, bytes: _Optional[int] = ..., blocks: _Optional[int] = ...) -> None: ...
