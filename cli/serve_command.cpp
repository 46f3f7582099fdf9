// deltaserve serve: the embedded mode. The OpenAI-compatible gateway and the model in one
// process, listening on 127.0.0.1:8000 unless told otherwise; stops on SIGINT or SIGTERM.
#include <signal.h>

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "deltaserve/api/chat_engine.h"
#include "deltaserve/api/http_gateway.h"
#include "run_options.h"

namespace deltaserve::cli {

int serve_main(int argc, char** argv) {
    RunOptions o;
    std::string host = "127.0.0.1";
    int32_t port = 8000, max_tokens = -1;
    api::EmbeddedOptions eo;
    int32_t ttl = static_cast<int32_t>(eo.session_ttl_seconds);
    ArgParser p("deltaserve serve",
                "Serves --model over an OpenAI-compatible HTTP API (POST /v1/chat/completions, GET "
                "/v1/models, /health, /metrics). Sampling flags are the defaults for requests that "
                "leave a field out. A session (X-Session-ID header or session_id field) keeps its "
                "history between turns: send only the new messages.");
    o.register_flags(p);
    p.add("host", &host, "address to listen on");
    p.add("port", &port, "port to listen on; 0 = any free port (printed at start)");
    p.add("max-tokens", &max_tokens,
          "tokens per answer when a request gives no max_tokens; -1 = no limit");
    p.add("max-sessions", &eo.max_sessions,
          "sessions remembered at most (least recently used go first)");
    p.add("session-ttl", &ttl, "seconds an idle session is remembered");
    if (auto exit_code = parse_flags(p, argc, argv)) return *exit_code;
    if (port < 0 || port > 65535 || eo.max_sessions < 1 || ttl < 1) {
        print_error(invalid_argument(
            "--port must be in [0, 65535], --max-sessions and --session-ttl >= 1"));
        return 2;
    }
    eo.session_ttl_seconds = ttl;
    // Block the stop signals before any thread starts, so that only sigwait below sees them.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a client that goes away is a write error, not a crash

    auto loaded = load_for_run(o);
    if (!loaded) {
        print_error(loaded.error());
        return 1;
    }
    const std::string model_id = std::filesystem::path(o.model_path).filename().string();
    api::EmbeddedChatEngine engine(std::move(loaded->model), std::move(loaded->ctx), model_id, eo);
    api::GatewayOptions go;
    go.host = host;
    go.port = static_cast<uint16_t>(port);
    go.sampling = o.sampling(p);
    go.default_max_tokens = max_tokens;
    auto gateway = api::HttpGateway::start(engine, go);
    if (!gateway) {
        print_error(gateway.error());
        return 1;
    }
    std::fprintf(stderr, "deltaserve: serving %s on http://%s:%u\n", model_id.c_str(), host.c_str(),
                 static_cast<unsigned>((*gateway)->port()));
    std::fflush(stderr);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "deltaserve: %s, stopping\n",
                 sig == SIGINT ? "interrupted" : "terminated");
    (*gateway)->stop();
    return 0;
}

}  // namespace deltaserve::cli
