# The cluster services between the gateway and the prefill and decode nodes (DESIGN.md
# "Processes": control plane Cap'n Proto RPC, data plane UCX). A node's bootstrap capability
# is a Node; it hands out the role it runs.
@0xb9235c44fde6c0eb;

$import "/capnp/c++.capnp".namespace("deltaserve::api::rpc");

struct Error {
  # A deltaserve Status that is not OK: the StatusCode number and its message.
  code @0 :UInt8;
  message @1 :Text;
}

struct Sampling {
  temperature @0 :Float32;
  topK @1 :Int32;
  topP @2 :Float32;
  minP @3 :Float32;
  repeatPenalty @4 :Float32;
  repeatLastN @5 :Int32;
  seed @6 :UInt64;
  presencePenalty @7 :Float32;
  frequencyPenalty @8 :Float32;
}

struct TurnSpec {
  turnId @0 :UInt64;
  sessionId @1 :Text;
  tokens @2 :List(Int32);
  sampling @3 :Sampling;
  maxTokens @4 :Int32;
  stop @5 :List(Text);
  cacheScope @6 :Text;
  shownTokens @7 :List(Int32);
  jsonSchema @8 :Text;  # structured output: the answer's JSON Schema ("" = free text)
  jsonPrefix @9 :Text;  # literal text before that value, and after it
  jsonSuffix @10 :Text;
  logprobs @11 :Int32 = -1;  # top logprobs per generated token (0..20); -1 = none
  promptLogprobs @12 :Int32 = -1;  # the prompt's too (decode::TurnSpec::prompt_logprobs)
  continued @13 :Int32;  # a moved turn: its answer so far ends tokens (TurnSpec::continued)
  continuedSent @14 :Int32;  # bytes of that answer's text the client has
}

struct TurnPlan {
  cachedTokens @0 :Int32;
  remotePrefill @1 :Bool;
  pullTokens @2 :Int32;
}

struct TurnEnd {
  union {
    error @0 :Error;
    done :group {
      finishReason @1 :Text;
      text @2 :Text;
      promptTokens @3 :Int32;
      cachedTokens @4 :Int32;
      completionTokens @5 :Int32;
      kvSource @6 :Text;  # where the cached tokens' KV came from (decode::TurnEnd::kv_source)
    }
  }
}

interface TokenSink {
  # Where a turn's text goes, hosted by the gateway. Calls arrive in order; end comes last.
  piece @0 (text :Text, tokens :List(Int32)) -> ();
  # tokens: the generated tokens taken since the last piece (TurnSink::on_token), this one's
  # among them.
  end @1 (end :TurnEnd) -> ();
  logprobs @2 (token :TokenLogprobs) -> ();
  # A generated token's log-probabilities (TurnSpec.logprobs), before its piece.
  promptDone @3 () -> ();
  # The prompt's KV is in (decode::TurnSink::on_prompt_done), before the first piece.
}

struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

struct TokenLogprobs {
  chosen @0 :TokenLogprob;
  top @1 :List(TokenLogprob);
  rank @2 :Int32;  # the chosen token's place, 1 = the most likely; 0 = not known
}

interface Turn {
  wait @0 () -> ();
  # Returns once the turn's end reached its sink; fails when the decode node is lost.
  cancel @1 (error :Error) -> ();
  # Ends the turn: "cancelled" without an error, else with it (a prefill that failed).
}

struct DecodeStats {
  sessions @0 :Int64;
  running @1 :Int64;
  waiting @2 :Int64;
  kvBytes @3 :Int64;
  keepRatio @4 :Float64;
  kvBytesReceived @5 :Int64;
  turns @6 :Int64;
  prefixCacheBytes @7 :Int64;
  prefixCacheBlocks @8 :Int64;
  prefixCacheHitTokens @9 :Int64;
  kvMemory @10 :Int64;
  kvBooked @11 :Int64;
  kvPoolUsed @12 :Int64;
  kvPoolPeak @13 :Int64;
  tiers @14 :TierStats;
}

struct Histogram {
  counts @0 :List(Int64);  # decode::LatencyHistogram's buckets, not cumulated
  sum @1 :Float64;
  count @2 :Int64;
}

struct TierStats {
  # decode::TierStats, field for field.
  hostBytes @0 :Int64;
  hostCapacity @1 :Int64;
  hostBlocks @2 :Int64;
  hostLeases @3 :Int64;
  diskBytes @4 :Int64;
  diskCapacity @5 :Int64;
  diskBlocks @6 :Int64;
  diskAdmitting @7 :Bool = true;
  diskDropped @8 :Int64;
  diskIoErrors @9 :Int64;
  diskRecoveryMs @10 :Float64;
  sessionsDemoted @11 :Int64;
  promotedHost @12 :Int64;
  promotedDisk @13 :Int64;
  promotedTokens @14 :Int64;
  prefixHost @15 :Int64;
  prefixDisk @16 :Int64;
  prefixTokens @17 :Int64;
  blocksMissing @18 :Int64;
  blocksRefused @19 :Int64;
  sessionsPersisted @20 :Int64;
  persistFailed @21 :Int64;
  blocksWritten @22 :Int64;
  bytesWritten @23 :Int64;
  storeSeconds @24 :Histogram;
  loadSeconds @25 :Histogram;
  deviceBytes @26 :Int64;
  deviceCapacity @27 :Int64;
  deviceBlocks @28 :Int64;
  promotedDevice @29 :Int64;
  prefixDevice @30 :Int64;
}

struct SessionKv {
  # decode::SessionKv: -1 (NaN, "") where not known.
  id @0 :Text;
  running @1 :Bool;
  tokens @2 :Int64;
  decodeBytes @3 :Int64;
  keepRatio @4 :Float64;
  policy @5 :Text;
  storedTokens @6 :Int64;
  hostBytes @7 :Int64;
  diskBytes @8 :Int64;
  blocks @9 :Int32;
  pinned @10 :Bool;
  deviceBytes @11 :Int64 = -1;
}

struct StoredBlockPlace {
  # decode::StoredBlockPlace: -1 where a tier does not hold the block.
  key @0 :UInt64;
  hostBytes @1 :Int64;
  diskBytes @2 :Int64;
  leases @3 :List(LeaseHolder);
  deviceBytes @4 :Int64 = -1;
}

struct LeaseHolder {
  owner @0 :Text;
  secondsLeft @1 :Float64;
}

struct SessionBlocks {
  # decode::SessionBlocks: the session's stored record (decode/session_record.h) and where
  # each of its blocks is.
  record @0 :Data;
  fingerprint @1 :UInt64;
  blocks @2 :List(StoredBlockPlace);
}

interface DecodeNode {
  startTurn @0 (spec :TurnSpec, sink :TokenSink) -> (plan :TurnPlan, turn :Turn, error :Error);
  # error is set (and the rest unset) when the turn was refused.
  dataAddress @1 () -> (address :Text);
  # Where prefill nodes ship KV to this node (the data plane).
  stats @2 () -> (stats :DecodeStats);
  dropSession @3 (sessionId :Text) -> ();
  # Forgets a session's KV (the gateway closed the session).
  sessionKv @4 (ids :List(Text)) -> (sessions :List(SessionKv), error :Error);
  # Where each session's KV is (the operators' views), kMaxSessionKvIds ids at most a call.
  checkpoint @5 (name :Text) -> (path :Text, error :Error);
  # A copy of the node's store for the tools (decode::DecodeWorker::checkpoint).
  evictSession @6 (sessionId :Text) -> (error :Error);
  # An idle session's KV out of decode memory into the tiers (an operator's evict).
  pinSession @7 (sessionId :Text, pinned :Bool, scope :Text) -> (error :Error);
  # Keeps a session's KV in decode memory (brought back from the tiers, under its turns'
  # cache scope, when they hold it), or lets the LRU have it again.
  sessionBlocks @8 (sessionId :Text) -> (blocks :SessionBlocks, error :Error);
  # A session's stored record and its blocks' places (decode::DecodeWorker::session_blocks).
  readBlock @9 (key :UInt64, limit :UInt64) -> (bytes :Data, error :Error);
  # A stored block's first `limit` bytes (0: all), for the tools.
}

struct PrefillRequest {
  turn @0 :TurnSpec;
  decodeAddress @1 :Text;
  pullTokens @2 :Int32;
}

struct PrefillResult {
  firstToken @0 :Int32;
  pulledTokens @1 :Int32;
  prefilledTokens @2 :Int32;
  bytesShipped @3 :Int64;
  seconds @4 :Float64;
}

struct PrefillStats {
  queued @0 :Int64;
  requests @1 :Int64;
  failures @2 :Int64;
  tokens @3 :Int64;
  bytesShipped @4 :Int64;
}

interface PrefillNode {
  prefill @0 (request :PrefillRequest) -> (result :PrefillResult, error :Error);
  stats @1 () -> (stats :PrefillStats);
  cancel @2 (turn :UInt64) -> ();
  # The turn's prefill stops, queued or running (PrefillWorker::cancel); an unknown turn is
  # ignored.
}

interface NodeDoor {
  # The bootstrap capability of a node's RPC port: the caller proves the cluster secret
  # (transport/peer_auth.h: prove(secret, "rpc", nonce)) before it reaches the Node.
  challenge @0 () -> (nonce :Text, gate :Gate);
}

interface Gate {
  open @0 (proof :Text) -> (node :Node);
  # Fails (and the gate is spent) when the proof is wrong or was tried before.
}

interface Node {
  info @0 () -> (role :Text, name :Text, modelId :Text, version :Text);
  decode @1 () -> (node :DecodeNode);
  # Fails on a node that does not decode.
  prefill @2 () -> (node :PrefillNode);
}
