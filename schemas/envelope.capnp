@0xc7f0878e97f17d97;
# The one message type of the archipelago wire. Every message between learners,
# sync brokers, parameter shards and the chaos monkey is an Envelope: a header
# and one body. Tensors never travel inside it: each tensor is an extra ZeroMQ
# frame after the Envelope frame, described by one TensorFrame entry, so a
# fragment of megabytes is sent straight from memory and stays out of Cap'n
# Proto's traversal limit. Evolution rules: schemas/README.md.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("archipelago::wire");

const protocolVersion :UInt16 = 2;
# Bumped only for a change an old peer would misread; a peer that receives a
# different version answers with an Error naming both versions. 2: broker epochs
# (Header.brokerEpoch; Contribution.brokerEpoch holds an epoch where 1 held an incarnation).

enum Role {
  learner @0;
  syncBroker @1;
  parameterShard @2;
  chaosMonkey @3;
  admin @4;             # an operator's tool (`archipelago set`): sends Reconfigure to the broker
}

struct NodeAddress {
  role @0 :Role;        # which kind of actor
  index @1 :UInt32;     # its index within the role (learner 3, shard 0, ...)
}

struct Header {
  protocolVersion @0 :UInt16;  # the sender's protocolVersion
  sender @1 :NodeAddress;      # who sent this message
  incarnation @2 :UInt64;      # sender's process incarnation; grows on every restart
  sequence @3 :UInt64;         # per (sender, incarnation), from 1, +1 per message; duplicate suppression key
  round @4 :UInt64;            # the round this message concerns; 0 when none
  brokerEpoch @5 :UInt64;      # the newest broker epoch the sender knows (a leading broker: its own);
                               # 0: none. An epoch is (incarnation << 8 | broker index): it names the
                               # broker that leads in it, and every node follows the newest one it hears
                               # of, from anyone. A broker's message of an older epoch is refused (fenced).
}

enum TensorEncoding {
  fp32 @0;   # raw little-endian float32
  bf16 @1;   # upper 16 bits of float32, round to nearest even
  int8 @2;   # per-block fp32 absmax scale + int8 codes
  int4 @3;   # per-block fp32 absmax scale + two int4 codes per byte
  int2 @4;   # per-block fp32 absmax scale + four ternary codes per byte
}

struct TensorFrame {
  # Describes the ZeroMQ frame at the same position after the Envelope frame.
  name @0 :Text;                 # tensor or fragment name, e.g. "fragment/3"
  encoding @1 :TensorEncoding;   # how the frame's bytes encode the values
  elementCount @2 :UInt64;       # float values after decoding
  byteLength @3 :UInt64;         # exact length of the frame in bytes
  blockSize @4 :UInt32;          # quantisation block (elements); ignored for fp32/bf16
  checksum @5 :UInt64;           # XXH3-64 of the frame's bytes; a mismatch rejects the message
}

struct Envelope {
  header @0 :Header;
  tensors @1 :List(TensorFrame);  # one entry per extra frame, in frame order
  body :union {
    join @2 :Join;
    welcome @3 :Welcome;
    heartbeat @4 :Heartbeat;
    leave @5 :Leave;
    progress @6 :Progress;
    roundOpen @7 :RoundOpen;
    contribution @8 :Contribution;
    roundClose @9 :RoundClose;
    fragmentUpdate @10 :FragmentUpdate;
    fetchFragment @11 :FetchFragment;
    chaosCommand @12 :ChaosCommand;
    error @13 :Error;
    ack @14 :Ack;
    brokerState @15 :BrokerState;
    reconfigure @16 :Reconfigure;
  }
}

struct Join {
  # A node announces itself (first start or rejoin with a new incarnation).
  layoutFingerprint @0 :UInt64;  # param_layout::fingerprint(); must match the mesh's
  configHash @1 :UInt64;         # hash of the knobs that must agree across the mesh
  batchTokens @2 :UInt32;        # tokens per inner step (learners)
  threads @3 :UInt16;            # compute threads (learners)
  endpoint @4 :Text;             # where this node can be reached, e.g. "tcp://10.0.0.5:7100"
  layout @5 :Text;               # param_layout::description(): a refusal names the first difference
}

struct ShardInfo {
  index @0 :UInt32;              # parameter shard index
  endpoint @1 :Text;             # where to reach it
  fragments @2 :List(UInt32);    # fragments it owns
}

struct Welcome {
  # The broker's answer to Join.
  fragments @0 :UInt32;              # P
  shards @1 :List(ShardInfo);        # who owns which fragment
  heartbeatIntervalMs @2 :UInt32;    # the mesh's heartbeat interval
  currentRound @3 :UInt64;           # next round the broker will open
  scheduleStep @4 :UInt64;           # to a restarted learner (an earlier incarnation is known): the
                                     # mesh's schedule position, its ledger's inner steps / M; else 0
  settings @5 :List(Setting);        # the knobs changed live (Reconfigure) since the mesh started, as in
                                     # force now: a node that (re)joins takes them; empty: none changed
}

struct Setting {
  key @0 :Text;      # a knob, as in a config file ("mesh.quorum")
  value @1 :Text;    # its value as text ("3")
}

struct Reconfigure {
  # admin → the leading broker: change knobs of the running mesh (mesh.quorum,
  # mesh.grace_factor, mesh.robust*). Checked like a config file; applied at a
  # round boundary (the next round opened); the broker answers at replyEndpoint
  # with an Ack (sequence: the first round under the new values) or an Error
  # (refused: the message says why, e.g. a knob in the mesh agreement hash).
  # The broker forwards an accepted change to the shards (mesh.robust* are theirs):
  # they apply it from their next round close.
  settings @0 :List(Setting);
  replyEndpoint @1 :Text;
}

struct Heartbeat {
  stepsDone @0 :UInt64;  # sender's inner steps so far (learners); 0 otherwise
  # The round trip of the control lane, measured without synchronised clocks: the
  # sender's clock when it sent this, and the recipient's own sentAtNs of the last
  # heartbeat the sender had from it, with how long the sender held it since.
  sentAtNs @1 :Int64;
  echoSentAtNs @2 :Int64;  # 0: none received yet
  echoHeldNs @3 :Int64;
}

struct Leave {
  reason @0 :Text;       # why the node leaves (shutdown, drain, ...)
}

struct Progress {
  # A learner's per-step report to the broker (small; every step).
  step @0 :UInt64;         # inner steps done by this incarnation
  stepTimeNs @1 :UInt64;   # duration of the last step
  tokens @2 :UInt64;       # tokens processed by this incarnation
  finished @3 :Bool;       # its last step is done: it stays only to flush its work (mesh.flush), and
                           # answers rounds only of fragments it stepped on since it last contributed
}

struct RoundOpen {
  fragment @0 :UInt32;     # fragment p of round header.round
  shard @1 :UInt32;        # the shard that collects contributions for it
  shardIncarnation @2 :UInt64;  # that shard's incarnation as the broker last heard it; 0: unknown.
                                # A learner that sees it grow re-fetches the shard's fragments
                                # (the shard restarted from its snapshot and lost their endpoints).
  version @3 :UInt64;      # the fragment's newest version the broker saw published; 0: unknown. A
                           # learner holding an older one (cut off, its broadcasts lost) fetches it and
                           # contributes only once it has it (learner_core::on_round_open)
}

struct Contribution {
  # A learner's progress on one fragment; tensors[0] is the delta θ_p − anchor_p.
  fragment @0 :UInt32;
  anchorVersion @1 :UInt64;  # version of Θ_p the delta is taken against
  steps @2 :UInt64;          # inner steps since that anchor (c_steps)
  tokens @3 :UInt64;         # tokens since that anchor (c_tokens)
  learner @4 :UInt32;        # shard → broker arrival notice: the contributing learner (no tensor)
  learnerIncarnation @5 :UInt64;  # ... and its incarnation
  step @6 :UInt64;           # the learner's inner steps done when it sent this (this incarnation)
  verdict @7 :Verdict;       # arrival notice: what the shard did with it (the token ledger)
  brokerEpoch @8 :UInt64;    # the epoch of the broker that opened round header.round (the RoundOpen's;
                             # copied into the arrival notice). A shard refuses (late) a round of an older
                             # epoch: a new broker's rounds are new ones, whatever their numbers.
                             # 0: unknown (taken as the current one).
}
enum Verdict {
  buffered @0;   # held for its round
  late @1;       # its round was closed already
  rejected @2;   # bad contribution: wrong fragment or size, non-finite values, a bound exceeded
}

struct Member {
  learner @0 :UInt32;        # learner index
  incarnation @1 :UInt64;    # its incarnation
  weight @2 :Float64;        # merge weight c_tokens² / c_steps (of tokens and steps below, when set)
  tokens @3 :UInt64;         # the tokens the broker lets this contribution count: its claim cut to what the
                             # learner's Progress reported and to its steps × batch × context; a shard
                             # rejects a contribution that claims more and weighs by these. 0 with steps 0:
                             # a broker of before this field (the claim is taken as is)
  steps @4 :UInt64;          # ... its steps, cut to the learner's reported steps
}

enum CloseReason {
  allEligible @0;    # every eligible learner contributed
  graceExpired @1;   # quorum reached, grace window ran out
  timeout @2;        # bounded wait exceeded without quorum
}

struct RoundClose {
  # The broker closes round header.round; the shard merges exactly these members.
  fragment @0 :UInt32;
  members @1 :List(Member);
  reason @2 :CloseReason;
  quorumNs @3 :Int64;        # time from open to quorum
  graceNs @4 :Int64;         # length of the grace window granted
}

struct FragmentUpdate {
  # A new global value of a fragment; tensors[0] is Θ_p (fp32).
  fragment @0 :UInt32;
  version @1 :UInt64;        # v_p after the outer step
  committed @2 :Bool;        # shard → broker: that version is durable in the shard's snapshot store
}

struct FetchFragment {
  # A joiner asks for the current Θ_p; the reply is a FragmentUpdate.
  fragment @0 :UInt32;
  replyEndpoint @1 :Text;    # where the joiner listens; the shard broadcasts there from now on
}

enum ChaosKind {
  crash @0;        # SIGKILL / actor kill
  pause @1;        # SIGSTOP for durationMs
  slowDown @2;     # multiply step time by factor
  shapeLink @3;    # apply link to the links between target and peer
  heal @4;         # undo every fault on target
  storageFault @5; # make target's store fail writes for durationMs
  impersonate @6;  # attacker drill: target (a learner) sends, with its own key, envelopes claiming to be
                   # peer (the broker: a RoundClose; a shard: a FragmentUpdate; a learner: a Contribution)
                   # each step for durationMs; every one must be refused (impersonation)
  lieTokens @7;    # attacker drill: target (a learner) claims factor × its tokens in every contribution
                   # for durationMs; the broker's bound must cut them and the shard reject them
  attack @8;       # a learner poisons its contributions (attack, factor) until healed or attack = none
}

enum AttackKind {
  none @0;         # honest contributions
  scaled @1;       # the delta × factor
  signFlip @2;     # −delta
  random @3;       # Gaussian noise with the delta's RMS, seeded by (learner, round, fragment)
  stale @4;        # a replay of the learner's first delta to that fragment under attack
  sideways @5;     # the honest norm along a fixed direction per fragment: cosine factor with the honest delta
}

struct LinkShape {
  bandwidthBytesPerS @0 :Float64;  # 0 = unlimited
  latencyNs @1 :Int64;
  jitterNs @2 :Int64;
  loss @3 :Float64;                # probabilities in [0, 1]
  duplicate @4 :Float64;
  reorder @5 :Float64;
  corrupt @6 :Float64;
}

struct ChaosCommand {
  kind @0 :ChaosKind;
  target @1 :NodeAddress;      # node the fault applies to
  peer @2 :NodeAddress;        # other end, for link faults
  durationMs @3 :UInt64;       # 0 = until healed
  factor @4 :Float64;          # slow-down factor
  link @5 :LinkShape;          # for shapeLink
  attack @6 :AttackKind;       # for attack
}

enum ErrorCode {
  versionMismatch @0;   # protocol versions differ (message names both)
  malformed @1;         # the envelope or a tensor frame failed validation
  unknownPeer @2;       # sender is not allowed or not a member
  badContribution @3;   # contribution rejected (NaN, stale anchor, wrong size)
  overloaded @4;        # a bounded queue is full; retry later
  internal @5;          # a bug on the answering side
  meshMismatch @6;      # a joining node's model layout or mesh policy differs from the mesh's
  fenced @7;            # a broker's message of an older epoch than the recipient knows (header.brokerEpoch)
  refused @8;           # a request the recipient will not carry out (the message says why)
}

struct Error {
  code @0 :ErrorCode;
  message @1 :Text;           # one line for a human
  inReplyTo @2 :UInt64;       # sequence of the offending message, 0 if unknown
}

struct Ack {
  sequence @0 :UInt64;        # sequence being acknowledged (a standby to its leader: the tape log index it has up to)
}

struct BrokerState {
  # The leading broker to its standbys, so that one can take over without the
  # leader's store: what a restarted broker reads back from its own store. Sent
  # as it changes (the lease before its rounds are announced) and each ledger
  # write; each entry is the snapshot store's own record (storage/FORMAT.md).
  roundsLeased @0 :UInt64;       # every round the leader opened or will open is below this
  ledger @1 :List(Data);         # LearnerLedger records (framed), one per learner incarnation
  tape @2 :List(Data);           # TapeRecord records (framed): the leader's tape log from index tapeFrom
  tapeFrom @3 :UInt64;           # the log index of tape[0] (a standby acknowledges with Ack.sequence)
  tapeOldest @4 :UInt64;         # the oldest index the leader still holds
}
