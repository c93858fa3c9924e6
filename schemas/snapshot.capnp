@0xc55b20aee37e9000;
# Records of the snapshot store (storage/FORMAT.md). Every value in the store is
# one of these messages as a single-segment flat array, followed by an 8-byte
# little-endian XXH3-64 of that array; a reader checks it before decoding.
#
# Evolution: append fields only (new ordinals); never renumber or change a type;
# bump StoreInfo.formatVersion only when an old reader would misread a record.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("archipelago::wire_snapshot");

struct StoreInfo {
  # meta column, key "store": written when the store is created (and when a
  # writer of a newer format opens it: only formatVersion changes).
  formatVersion @0 :UInt32;      # 2 (1: every fragment state's floats inline)
  createdNs @1 :Int64;           # wall clock, ns since the Unix epoch
  configToml @2 :Text;           # the run's whole configuration (config.hpp to_toml)
  layoutFingerprint @3 :UInt64;  # param_layout::fingerprint() of the model
  meshHash @4 :UInt64;           # mesh_agreement_hash() of the configuration
  paramFloats @5 :UInt64;        # the full parameter buffer's length in floats
}

struct FragmentState {
  # fragments column, key be32(fragment) ++ be64(version). Format 1 holds the
  # floats in theta..adamV; format 2 holds them in FragmentPiece records (the
  # pieces column) and leaves those four empty.
  fragment @0 :UInt32;
  version @1 :UInt64;
  round @2 :UInt64;              # the round whose close produced it; 0 for the initial value
  timeNs @3 :Int64;              # wall clock when the shard published it
  theta @4 :Data;                # Θ_p: float32 little-endian, the fragment's tensors in plan order
  momentum @5 :Data;             # the outer Nesterov buffer, same length (empty in gradient mode)
  adamM @6 :Data;                # gradient mode (dp): the shard's AdamW moments, else empty
  adamV @7 :Data;
  adamSteps @8 :Int64;           # gradient mode: AdamW steps taken
  thetaChecksum @9 :UInt64;      # XXH3-64 of theta's bytes (what `replay verify` compares)
  pieceFloats @10 :UInt64;       # format 2: floats per FragmentPiece (a part's last piece holds the
                                 # rest); 0: the floats are inline (format 1)
  thetaFloats @11 :UInt64;       # format 2: the length of each part, in floats
  momentumFloats @12 :UInt64;
  adamMFloats @13 :UInt64;
  adamVFloats @14 :UInt64;
}

struct FragmentPiece {
  # pieces column, key be32(fragment) ++ be64(version) ++ be32(index) (format 2):
  # a fragment state's floats, part by part (theta, momentum, adamM, adamV; an
  # empty part has none), each part cut into pieces of FragmentState.pieceFloats.
  fragment @0 :UInt32;
  version @1 :UInt64;
  index @2 :UInt32;              # from 0, in key order
  part @3 :UInt8;                # 0 theta, 1 momentum, 2 adamM, 3 adamV
  offset @4 :UInt64;             # the part's float this piece starts at
  data @5 :Data;                 # float32 little-endian
}

struct ManifestEntry {
  fragment @0 :UInt32;
  version @1 :UInt64;
  round @2 :UInt64;
  thetaChecksum @3 :UInt64;
  stateBytes @4 :UInt64;         # the fragment state's floats × 4 (retention in bytes); 0: unknown (format 1)
}

struct LedgerTotals {
  mergedTokens @0 :UInt64;
  lateTokens @1 :UInt64;
  rejectedTokens @2 :UInt64;
  lostTokens @3 :UInt64;         # shards: buffered but not merged (not a member); broker: lost
  processedTokens @4 :UInt64;    # tokens the learners reported processed; 0 when unknown here
  overwrittenTokens @5 :UInt64;  # broker: token-shares installed over before they were contributed
}

struct Manifest {
  # manifests column, key be64(meshVersion): a consistent cut, committed in the
  # same atomic batch as every fragment state it names that is new.
  meshVersion @0 :UInt64;
  timeNs @1 :Int64;
  meshHash @2 :UInt64;
  entries @3 :List(ManifestEntry);  # one per fragment held in this store, ascending
  ledger @4 :LedgerTotals;          # the shards' ledger at the cut
  learnerSteps @5 :UInt64;          # mean inner steps per learner at the cut (the LR schedule's position); 0 if unknown
}

struct RecordedContribution {
  learner @0 :UInt32;
  incarnation @1 :UInt64;
  steps @2 :UInt64;
  tokens @3 :UInt64;
  delta @4 :Data;                # float32 little-endian
}

struct MergeRecord {
  # contributions column, key be32(fragment) ++ be64(version): exactly the
  # contributions merged into that version, in the order the shard merged them.
  fragment @0 :UInt32;
  version @1 :UInt64;
  round @2 :UInt64;
  contributions @3 :List(RecordedContribution);
}

struct TapeMember {
  learner @0 :UInt32;
  incarnation @1 :UInt64;
  weight @2 :Float64;
  tokens @3 :UInt64;
  steps @4 :UInt64;
}

struct TapeRecord {
  # tape column, key be64(sequence): one round, written when its fragment
  # version was committed by the shard.
  round @0 :UInt64;
  fragment @1 :UInt32;
  openedNs @2 :Int64;            # the broker's clock
  quorumNs @3 :Int64;            # -1: quorum never reached
  graceNs @4 :Int64;
  closedNs @5 :Int64;
  reason @6 :Text;               # all_eligible | grace_expired | timeout
  members @7 :List(TapeMember);  # in arrival order
  late @8 :List(TapeMember);     # late contributions known at commit (weight 0)
  version @9 :UInt64;            # the committed fragment version
  committedNs @10 :Int64;        # wall clock
  brokerEpoch @11 :UInt64;       # the epoch of the broker that closed the round (0: an older writer)
  settings @12 :Text;            # knobs changed live that took effect since the previous taped round:
                                 # "from round R: mesh.quorum=3 mesh.grace_factor=1.5"; empty: none
  screenedOut @13 :List(TapeMember);  # members a shard rejected at the close (a claim above its
                                      # bound, mesh.robust's screening): decided, not merged
}

struct LearnerLedger {
  # ledger column, key be32(learner) ++ be64(incarnation): the broker's ledger for one incarnation.
  learner @0 :UInt32;
  incarnation @1 :UInt64;
  totals @2 :LedgerTotals;
  steps @3 :UInt64;              # the incarnation's inner steps the totals cover (its last Progress); 0: unknown (older writers)
  stepTimeS @4 :Float64;         # seconds of step time summed over those steps
  mergedStepTimeS @5 :Float64;   # ... over those whose tokens were merged
  endpoint @6 :Text;             # where the incarnation listens (its Join), so that a restarted broker
                                 # greets it at once; empty: unknown, or it left
  fragments @7 :List(LedgerTotals);  # the same totals per fragment (token-shares), summing to `totals`;
                                     # empty: an older writer (the incarnation is then counted afresh)
  # The tail: the last steps (up to `steps`) whose shares a later outcome may still
  # raise, from the lowest window start of its fragments (their last installs), so
  # that a restarted broker can still credit the work that was in flight. Empty:
  # none (or an older writer: those steps stay in their stored buckets).
  tailTokens @8 :List(UInt32);  # tokens per step, oldest first
  tailTimeUs @9 :List(UInt32);  # step time per step, microseconds
  tailBuckets @10 :Data;        # P per step: 0 lost, 1 overwritten, 2 rejected, 3 late, 4 merged
}

struct RoundLease {
  # meta column, key "round_lease": round numbers a broker handed out. A broker
  # raises it before it announces a round at or above it, so a restarted broker
  # numbers its rounds from here, after every round its predecessors opened.
  roundsBelow @0 :UInt64;        # every round opened so far is below this
  incarnation @1 :UInt64;        # the broker incarnation that wrote it
  timeNs @2 :Int64;              # wall clock, ns since the Unix epoch
}

struct EvalRecord {
  # evals column, key be64(meshVersion): eval loss measured on the model of that cut.
  meshVersion @0 :UInt64;
  timeNs @1 :Int64;
  evalLoss @2 :Float64;          # nats per byte
  tokens @3 :UInt64;             # tokens processed by the learners so far
}
