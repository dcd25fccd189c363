from dayzero.rpc.v1 import common_pb2 as _common_pb2
from dayzero.rpc.v1 import transfer_pb2 as _transfer_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AllocateRequest(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "max_tokens", "lease_seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: int
    max_tokens: int
    lease_seconds: float
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_tokens: _Optional[int] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ("allocation", "receiver")
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    RECEIVER_FIELD_NUMBER: _ClassVar[int]
    allocation: _transfer_pb2.KVAllocation
    receiver: _transfer_pb2.KVReceiverInfo
    def __init__(self, allocation: _Optional[_Union[_transfer_pb2.KVAllocation, _Mapping]] = ..., receiver: _Optional[_Union[_transfer_pb2.KVReceiverInfo, _Mapping]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling", "lease_id", "first_token_id", "first_logprob", "kv_wait_seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    KV_WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    lease_id: str
    first_token_id: int
    first_logprob: _common_pb2.TokenLogprob
    kv_wait_seconds: float
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., lease_id: _Optional[str] = ..., first_token_id: _Optional[int] = ..., first_logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., kv_wait_seconds: _Optional[float] = ...) -> None: ...

class DecodeResponse(_message.Message):
    __slots__ = ("token_ids", "logprobs", "finish_reason")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    finish_reason: _common_pb2.FinishReason
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("request_id", "lease_id", "kv_senders")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KV_SENDERS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lease_id: str
    kv_senders: int
    def __init__(self, request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., kv_senders: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released", "blocks_freed")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FREED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    blocks_freed: int
    def __init__(self, released: _Optional[bool] = ..., blocks_freed: _Optional[int] = ...) -> None: ...
