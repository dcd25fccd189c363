from dayzero.rpc.v1 import common_pb2 as _common_pb2
from dayzero.rpc.v1 import transfer_pb2 as _transfer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PrefillRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "target", "receiver")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    target: _transfer_pb2.KVAllocation
    receiver: _transfer_pb2.KVReceiverInfo
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., target: _Optional[_Union[_transfer_pb2.KVAllocation, _Mapping]] = ..., receiver: _Optional[_Union[_transfer_pb2.KVReceiverInfo, _Mapping]] = ...) -> None: ...

class PrefillResponse(_message.Message):
    __slots__ = ("first_token_id", "first_logprob", "kv_bytes", "kv_transfer_seconds", "prefill_seconds", "queue_seconds", "transport")
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_TRANSFER_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    first_token_id: int
    first_logprob: _common_pb2.TokenLogprob
    kv_bytes: int
    kv_transfer_seconds: float
    prefill_seconds: float
    queue_seconds: float
    transport: str
    def __init__(self, first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., kv_bytes: _Optional[int] = ..., kv_transfer_seconds: _Optional[float] = ..., prefill_seconds: _Optional[float] = ..., queue_seconds: _Optional[float] = ..., transport: _Optional[str] = ...) -> None: ...
