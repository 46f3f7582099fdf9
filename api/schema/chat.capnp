# The chat service clients use (the Cap'n Proto peer of POST /v1/chat/completions), and the
# admin service operators use (deltactl). Served by `deltaserve serve --rpc-port N` and by the
# cluster's gateway (gateway.rpc in the cluster config).
@0xdf68ac8e629439fd;

$import "/capnp/c++.capnp".namespace("deltaserve::api::rpc");
using Cluster = import "cluster.capnp";

struct Message {
  role @0 :Text;     # system, user or assistant
  content @1 :Text;
}

struct SendOptions {
  sampling @0 :Cluster.Sampling;  # temperature 0 = greedy
  seedGiven @1 :Bool;              # false: the server picks a seed
  maxTokens @2 :Int32 = -1;        # -1: up to the context size
  stop @3 :List(Text);
}

struct Usage {
  promptTokens @0 :Int32;
  completionTokens @1 :Int32;
  cachedTokens @2 :Int32;          # prompt tokens whose KV the session already held
}

interface ChatSession {
  send @0 (messages :List(Message), options :SendOptions, sink :Cluster.TokenSink)
      -> (finishReason :Text, text :Text, usage :Usage, error :Cluster.Error);
  # Runs a turn with the new messages; the answer streams to sink.piece (only piece is
  # called), and every piece has reached the sink when send returns. error is set when the
  # turn failed. One send at a time per session.
  cancel @1 () -> ();
  # Ends the running send early (finishReason "cancelled").
  close @2 () -> ();
  # Forgets the session (its history and KV).
  info @3 () -> (id :Text, messages :Int32);
}

interface ChatService {
  open @0 (sessionId :Text) -> (session :ChatSession);
  # Opens a session, or reopens one by its id ("" makes a new id).
  models @1 () -> (ids :List(Text));
}

struct SessionInfo {
  id @0 :Text;
  messages @1 :Int32;
  idleSeconds @2 :Int64;
}

interface Admin {
  stats @0 () -> (sessions :Int64, queued :Int64, kvBytes :Int64, keepRatio :Float64,
                  kvBytesShipped :Int64, prefillRetries :Int64);
  sessions @1 () -> (sessions :List(SessionInfo));
}

interface Gateway {
  # The bootstrap capability of a gateway's RPC port.
  chat @0 () -> (service :ChatService);
  admin @1 () -> (admin :Admin);
}
