# The chat service clients use (the Cap'n Proto peer of POST /v1/chat/completions), and the
# admin service operators use (deltactl). Served by `deltaserve serve --rpc-port N` and by the
# cluster's gateway (gateway.rpc in the cluster config).
@0xdf68ac8e629439fd;

$import "/capnp/c++.capnp".namespace("deltaserve::api::rpc");
using Cluster = import "cluster.capnp";

struct Message {
  role @0 :Text;     # system, developer, user, assistant or tool
  content @1 :Text;
  toolCallId @2 :Text;          # a tool message's: the call it answers
  toolCalls @3 :List(ToolCall); # an assistant message's calls
}

struct ToolCall {
  id @0 :Text;
  name @1 :Text;
  arguments @2 :Text;  # a JSON object, as text
}

struct LogprobToken {
  bytes @0 :Data;      # the token's text
  logprob @1 :Float32;
}

struct LogprobEntry {
  chosen @0 :LogprobToken;
  top @1 :List(LogprobToken);  # the most likely first
}

struct SendOptions {
  sampling @0 :Cluster.Sampling;  # temperature 0 = greedy
  seedGiven @1 :Bool;              # false: the server picks a seed
  maxTokens @2 :Int32 = -1;        # -1: up to the context size
  stop @3 :List(Text);
  jsonSchema @4 :Text;             # structured output: the answer's JSON Schema ("" = text),
                                   # checked as HTTP's response_format is
  tools @5 :Text;                  # OpenAI's tools array as JSON text ("" = none)
  toolChoice @6 :Text;             # OpenAI's tool_choice as JSON text ("" = auto)
  parallelToolCalls @7 :Bool = true;
  topLogprobs @8 :Int32 = -1;      # each answer token's logprob and this many top tokens
                                   # (0-20); -1 = none
}

struct Usage {
  promptTokens @0 :Int32;
  completionTokens @1 :Int32;
  cachedTokens @2 :Int32;          # prompt tokens whose KV the session already held
}

interface ChatSession {
  send @0 (messages :List(Message), options :SendOptions, sink :Cluster.TokenSink)
      -> (finishReason :Text, text :Text, usage :Usage, error :Cluster.Error,
          toolCalls :List(ToolCall), logprobs :List(LogprobEntry));
  # Runs a turn with the new messages; the answer's text streams to sink.piece (only piece
  # is called), and every piece has reached the sink when send returns. text is the answer
  # less its tool calls (finishReason "tool_calls" when it made some). error is set when
  # the turn failed. One send at a time per session.
  cancel @1 () -> ();
  # Ends the running send early (finishReason "cancelled").
  close @2 () -> ();
  # Forgets the session (its history and KV).
  info @3 () -> (id :Text, messages :Int32, turns :Int32, tokens :Int64, cachedTokens :Int64,
                 error :Cluster.Error);
  # error: the session was closed (or forgotten, idle).
}

interface ChatService {
  # Sessions belong to the API key that opened them; to another key they do not exist.
  open @0 (sessionId :Text) -> (session :ChatSession, error :Cluster.Error);
  # Reopens a session this key opened; "" opens a new one with an unguessable id (info says
  # it). An id that is not open is an error (code NOT_FOUND), never a new conversation.
  models @1 () -> (ids :List(Text));
  create @2 (sessionId :Text) -> (session :ChatSession, error :Cluster.Error);
  # Opens a session named sessionId (1-128 of A-Z a-z 0-9 . _ : -; "" = a made id).
}

struct SessionInfo {
  id @0 :Text;
  messages @1 :Int32;
  idleSeconds @2 :Int64;
  tenant @3 :Text;   # the key's tag
  turns @4 :Int32;
  tokens @5 :Int64;
}

struct SessionRow {
  # One session as an operator sees it (deltactl sessions): -1 where not known.
  id @0 :Text;
  tenant @1 :Text;
  node @2 :Text;
  turns @3 :Int32;
  messages @4 :Int32;
  tokens @5 :Int64;
  lastUseUnix @6 :Int64;
  ttlLeftSeconds @7 :Int64;
  running @8 :Bool;
  inMemory @9 :Bool;      # false: only its record holds it
  kv @10 :Cluster.SessionKv;  # where its KV is; kv.id "" when its node did not answer
}

struct NodeStats {
  name @0 :Text;
  error @1 :Cluster.Error;  # set when the node did not answer
  stats @2 :Cluster.DecodeStats;
  rpcAddress @3 :Text;      # "in-process" for serve's own worker
  dataAddress @4 :Text;
  version @5 :Text;
}

struct PrefillNodeStats {
  name @0 :Text;
  error @1 :Cluster.Error;
  stats @2 :Cluster.PrefillStats;
  rpcAddress @3 :Text;
  version @4 :Text;
}

interface Admin {
  stats @0 () -> (sessions :Int64, queued :Int64, kvBytes :Int64, keepRatio :Float64,
                  kvBytesShipped :Int64, prefillRetries :Int64);
  sessions @1 () -> (sessions :List(SessionInfo));
  sessionPage @2 (after :Text, limit :Int32) -> (sessions :List(SessionRow), next :Text);
  # The sessions after key `after` (tenant/id; "" from the first), in key order, `limit` at
  # most (1-1000): the next page starts after `next` ("" at the end). Never blocks serving:
  # each decode node is asked once for the page.
  nodes @3 () -> (nodes :List(NodeStats));
  # Each decode node's stats, its tiered store's among them.
  cluster @4 () -> (version :Text, model :Text, decode :List(NodeStats),
                    prefill :List(PrefillNodeStats));
  # The gateway's version and model, and every node behind it.
  checkpoint @5 (name :Text) -> (paths :List(Text), error :Cluster.Error);
  # A copy of every store (each decode node's, the gateway's records) under
  # <data dir>/checkpoints/<name>, in the data dir's layout, for deltactl's offline views
  # while the server runs. name: 1-64 of A-Z a-z 0-9 . _ -.
  dropSession @6 (tenant :Text, id :Text) -> (error :Cluster.Error);
  # Forgets a session: its history and its KV wherever it is (as its owner's close).
  evictSession @7 (tenant :Text, id :Text) -> (error :Cluster.Error);
  # Takes an idle session's KV out of decode memory into the tiers; its next turn promotes it.
  pinSession @8 (tenant :Text, id :Text, pinned :Bool) -> (error :Cluster.Error);
  # Keeps a session and its KV in memory (unpinned: the LRU and TTL have it again).
  sessionBlocks @9 (tenant :Text, id :Text) -> (node :Text, blocks :Cluster.SessionBlocks,
                                                error :Cluster.Error);
  # The session's stored record on its node, and where each block is (tiers, leases).
  readBlock @10 (node :Text, key :UInt64, limit :UInt64) -> (bytes :Data, error :Cluster.Error);
  # A stored block's first `limit` bytes (0: all) on a decode node, for the tools' checks.
}

interface Gateway {
  # The bootstrap capability of a gateway's RPC port. apiKey: one of the server's --api-key
  # keys (ignored when it has none); adminKey: one of its --admin-key keys (any, when it has
  # neither kind). A wrong key gets error (UNAUTHENTICATED) and no capability.
  chat @0 (apiKey :Text) -> (service :ChatService, error :Cluster.Error);
  admin @1 (adminKey :Text) -> (admin :Admin, error :Cluster.Error);
}
