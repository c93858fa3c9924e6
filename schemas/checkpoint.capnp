@0xdacab975ea5f58e7;
# A model checkpoint file, as written by `archipelago train --out FILE` and read by
# `archipelago sample` and `archipelago bench`.
#
# File layout (little-endian):
#   bytes 0..7    magic "ARCHCKPT"
#   bytes 8..15   UInt64: length of the header below, in bytes (a multiple of 8)
#   header        one Cap'n Proto message (single segment, flat array) of CheckpointHeader
#   payload       paramFloats float32 values: the parameter buffer exactly as laid out
#                 by actors/core/layout (tensors 64-byte aligned, padding zero)
#
# Evolution: append fields only (new ordinals); never renumber or change a type;
# bump formatVersion only when an old reader would misread the payload.

struct ModelShape {
  vocab @0 :UInt32;      # 256: bytes
  context @1 :UInt32;    # positions per sequence (T)
  dModel @2 :UInt32;     # residual width (C)
  nLayer @3 :UInt32;     # transformer blocks (L)
  nHead @4 :UInt32;      # attention heads; divides dModel
  tied @5 :Bool;         # unembedding shares the token embedding
}

struct CheckpointHeader {
  formatVersion @0 :UInt32;      # 1
  shape @1 :ModelShape;          # the layout is derived from this alone
  layoutFingerprint @2 :UInt64;  # param_layout::fingerprint(); must match on load
  paramFloats @3 :UInt64;        # payload length in floats
  payloadChecksum @4 :UInt64;    # XXH3-64 of the payload bytes
  steps @5 :UInt64;              # optimizer steps taken
  tokens @6 :UInt64;             # training tokens seen
  trainLoss @7 :Float64;         # nats/token, last logged
  evalLoss @8 :Float64;          # nats/token on the held-out part; NaN if never evaluated
  corpus @9 :Text;               # corpus name ("synthetic" or a path)
  seed @10 :UInt64;              # train.seed
}
