from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class KvLayout(_message.Message):
    __slots__ = ("model", "num_layers", "num_kv_heads", "head_dim", "block_size", "dtype", "tp_rank", "tp_size", "order", "hash")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    ORDER_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: str
    tp_rank: int
    tp_size: int
    order: str
    hash: str
    def __init__(self, model: _Optional[str] = ..., num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_size: _Optional[int] = ..., dtype: _Optional[str] = ..., tp_rank: _Optional[int] = ..., tp_size: _Optional[int] = ..., order: _Optional[str] = ..., hash: _Optional[str] = ...) -> None: ...

class HandshakeReply(_message.Message):
    __slots__ = ("layout", "pool_export")
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    POOL_EXPORT_FIELD_NUMBER: _ClassVar[int]
    layout: KvLayout
    pool_export: bytes
    def __init__(self, layout: _Optional[_Union[KvLayout, _Mapping]] = ..., pool_export: _Optional[bytes] = ...) -> None: ...

class KvChunk(_message.Message):
    __slots__ = ("request_id", "layout_hash", "layer", "block_offset", "num_blocks", "data", "last", "num_layers")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_HASH_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    layout_hash: str
    layer: int
    block_offset: int
    num_blocks: int
    data: bytes
    last: bool
    num_layers: int
    def __init__(self, request_id: _Optional[str] = ..., layout_hash: _Optional[str] = ..., layer: _Optional[int] = ..., block_offset: _Optional[int] = ..., num_blocks: _Optional[int] = ..., data: _Optional[bytes] = ..., last: _Optional[bool] = ..., num_layers: _Optional[int] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("bytes", "chunks")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    chunks: int
    def __init__(self, bytes: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class KvControl(_message.Message):
    __slots__ = ("request_id", "attach", "chunk", "release")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    attach: KvAttach
    chunk: KvChunk
    release: bool
    def __init__(self, request_id: _Optional[str] = ..., attach: _Optional[_Union[KvAttach, _Mapping]] = ..., chunk: _Optional[_Union[KvChunk, _Mapping]] = ..., release: _Optional[bool] = ...) -> None: ...

class KvAttach(_message.Message):
    __slots__ = ("block_ids", "layout_hash")
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_HASH_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    layout_hash: str
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ..., layout_hash: _Optional[str] = ...) -> None: ...

class KvControlEvent(_message.Message):
    __slots__ = ("request_id", "attached", "forgotten", "ack", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ATTACHED_FIELD_NUMBER: _ClassVar[int]
    FORGOTTEN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    attached: bool
    forgotten: bool
    ack: PushAck
    error: KvError
    def __init__(self, request_id: _Optional[str] = ..., attached: _Optional[bool] = ..., forgotten: _Optional[bool] = ..., ack: _Optional[_Union[PushAck, _Mapping]] = ..., error: _Optional[_Union[KvError, _Mapping]] = ...) -> None: ...

class KvError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
