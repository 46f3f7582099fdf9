// Shipment throughput of the UCX transport against ucx_perftest on the same link.
//
// Two processes, as a prefill and a decode node would be: this program spawns itself as the
// receiver, sends `--bytes` worth of messages of each size from pool buffers, and times
// until the receiver acknowledges the last one. In the same run, alternating with it,
// ucx_perftest measures UCP active-message (ucp_am_bw, what the transport uses; also with
// peer error handling, -e, as the transport's endpoints are made) and tag-matching (tag_bw)
// bandwidth with the same UCX_TLS, message size and count. Prints a table and, with --json,
// a summary. MiB/s throughout (ucx_perftest's "MB/s" are MiB/s).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deltaserve/transport/transport_factory.h"

extern char** environ;

namespace {

using namespace deltaserve;
using namespace deltaserve::transport;
using namespace std::chrono_literals;

struct Options {
    std::string tls = "tcp";
    std::vector<size_t> sizes = {64 << 10, 1 << 20, 4 << 20};
    size_t bytes = size_t{1} << 30;  // per size and run
    int runs = 3;
    std::string json;
    bool receiver = false;
};

Message control(const char* what) {
    Message m;
    m.header.resize(std::strlen(what));
    std::memcpy(m.header.data(), what, m.header.size());
    return m;
}

bool is(const Message& m, const char* what) {
    return m.header.size() == std::strlen(what) &&
           std::memcmp(m.header.data(), what, m.header.size()) == 0;
}

TransportOptions transport_options(const Options& o) {
    TransportOptions t;
    t.ucx_tls = o.tls;
    t.pool_bytes = size_t{256} << 20;
    return t;
}

// The receiving process: prints its address, then acknowledges every "done".
int run_receiver(const Options& o) {
    auto t = make_transport("ucx", transport_options(o));
    if (!t.ok()) return std::fprintf(stderr, "%s\n", t.error().to_string().c_str()), 2;
    auto l = (*t)->listen("127.0.0.1:0");
    if (!l.ok()) return std::fprintf(stderr, "%s\n", l.error().to_string().c_str()), 2;
    std::printf("listening on %s\n", (*l)->address().c_str());
    std::fflush(stdout);
    auto c = (*l)->accept(deadline_in(60s));
    if (!c.ok()) return std::fprintf(stderr, "%s\n", c.error().to_string().c_str()), 2;
    for (;;) {
        auto m = (*c)->receive(deadline_in(600s));
        if (!m.ok()) return 0;  // the sender closed
        if (is(*m, "done")) {
            if (!(*c)->send(control("ack"), deadline_in(60s)).ok()) return 2;
        }
    }
}

// MiB/s of one timed round: count messages of size, then wait for the ack.
Result<double> send_round(Transport& t, Connection& c, size_t size, size_t count) {
    const auto start = Clock::now();
    for (size_t i = 0; i < count; ++i) {
        DS_ASSIGN_OR_RETURN(Buffer b, t.allocate(size, deadline_in(60s)));
        Message m;
        m.header.assign(16, std::byte{0});
        m.payload = std::move(b);
        DS_RETURN_IF_ERROR(c.send(std::move(m), deadline_in(60s)));
    }
    DS_RETURN_IF_ERROR(c.send(control("done"), deadline_in(60s)));
    DS_ASSIGN_OR_RETURN(Message ack, c.receive(deadline_in(120s)));
    if (!is(ack, "ack")) return internal_error("unexpected answer from the receiver");
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return static_cast<double>(size * count) / seconds / (1 << 20);
}

// Runs a command, returns its stdout (stderr passes through).
std::string run_capture(std::vector<std::string> args, pid_t* background = nullptr) {
    int out[2];
    if (pipe(out) != 0) return "";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    if (rc != 0) {
        close(out[0]);
        return "";
    }
    std::string text;
    char buf[4096];
    if (background) {
        // Read up to the receiver's address line (UCX may log to stdout first), leave it
        // running.
        const std::string marker = "listening on ";
        char ch;
        while (read(out[0], &ch, 1) == 1) {
            if (ch != '\n') {
                text.push_back(ch);
            } else if (text.rfind(marker, 0) == 0) {
                *background = pid;
                return text.substr(marker.size());
            } else {
                text.clear();
            }
        }
        *background = pid;
        return "";
    }
    ssize_t n;
    while ((n = read(out[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
    close(out[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return text;
}

// ucx_perftest's overall bandwidth (MiB/s) for one test, or -1. With peer error handling
// (-e) its endpoints are made as the transport's are (UCP_ERR_HANDLING_MODE_PEER).
double perftest(const std::string& test, size_t size, size_t count, int port, bool peer_errors) {
    const std::string p = std::to_string(port);
    pid_t server = 0;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    std::vector<std::string> sargs = {"ucx_perftest", "-p", p};
    if (peer_errors) sargs.push_back("-e");
    std::vector<char*> sargv;
    for (auto& a : sargs) sargv.push_back(a.data());
    sargv.push_back(nullptr);
    const int rc = posix_spawnp(&server, "ucx_perftest", &actions, nullptr, sargv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return -1;
    std::string out;
    for (int attempt = 0; attempt < 50; ++attempt) {
        usleep(100000);
        std::vector<std::string> args = {"ucx_perftest", "127.0.0.1", "-p", p, "-t", test, "-s",
                                         std::to_string(size), "-n", std::to_string(count)};
        if (peer_errors) args.push_back("-e");
        out = run_capture(args);
        if (out.find("Final:") != std::string::npos) break;
    }
    kill(server, SIGTERM);
    waitpid(server, nullptr, 0);
    const size_t at = out.find("Final:");
    if (at == std::string::npos) return -1;
    // Final: iterations, 50%ile, avg, overall (usec), bw avg, bw overall, rate avg, overall
    double v[8] = {};
    if (std::sscanf(out.c_str() + at, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2],
                    &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) {
        return -1;
    }
    return v[5];
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

std::vector<size_t> parse_sizes(const std::string& s) {
    std::vector<size_t> out;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        out.push_back(std::stoull(s.substr(pos, end - pos)));
        pos = end + 1;
    }
    return out;
}

int run_sender(const char* self, const Options& o) {
    // The receiver and ucx_perftest see the same transports (empty: UCX's own choice).
    if (o.tls.empty()) {
        unsetenv("UCX_TLS");
    } else {
        setenv("UCX_TLS", (o.tls.find("tcp") == std::string::npos ? o.tls + ",tcp" : o.tls).c_str(),
               1);
    }
    pid_t receiver = 0;
    const std::string address = run_capture({self, "--receiver", "--tls", o.tls}, &receiver);
    if (address.empty()) return std::fprintf(stderr, "the receiver did not start\n"), 2;
    auto t = make_transport("ucx", transport_options(o));
    if (!t.ok()) return std::fprintf(stderr, "%s\n", t.error().to_string().c_str()), 2;
    auto c = (*t)->connect(address, deadline_in(30s));
    if (!c.ok()) return std::fprintf(stderr, "%s\n", c.error().to_string().c_str()), 2;

    nlohmann::json rows = nlohmann::json::array();
    const std::string tls = getenv("UCX_TLS") ? getenv("UCX_TLS") : "(UCX default)";
    std::printf("UCX_TLS=%s, %zu MiB per size and run, median of %d runs (MiB/s)\n", tls.c_str(),
                o.bytes >> 20, o.runs);
    std::printf("%10s %12s %14s %8s %17s %8s %14s\n", "size", "deltaserve", "perftest am_bw",
                "ratio", "am_bw -e (peer)", "ratio", "perftest tag");
    int port = 20000 + getpid() % 20000;
    for (size_t size : o.sizes) {
        const size_t count = std::max<size_t>(o.bytes / size, 16);
        if (auto warm = send_round(**t, **c, size, std::min<size_t>(count, 64)); !warm.ok()) {
            return std::fprintf(stderr, "%s\n", warm.error().to_string().c_str()), 2;
        }
        std::vector<double> ours, am, am_peer, tag;
        for (int r = 0; r < o.runs; ++r) {
            auto bw = send_round(**t, **c, size, count);
            if (!bw.ok()) return std::fprintf(stderr, "%s\n", bw.error().to_string().c_str()), 2;
            ours.push_back(*bw);
            am.push_back(perftest("ucp_am_bw", size, count, port++, false));
            am_peer.push_back(perftest("ucp_am_bw", size, count, port++, true));
            tag.push_back(perftest("tag_bw", size, count, port++, false));
        }
        const double m_ours = median(ours), m_am = median(am), m_peer = median(am_peer),
                     m_tag = median(tag);
        const double r_am = m_am > 0 ? m_ours / m_am : 0.0, r_peer = m_peer > 0 ? m_ours / m_peer : 0.0;
        std::printf("%10zu %12.0f %14.0f %8.2f %17.0f %8.2f %14.0f\n", size, m_ours, m_am, r_am,
                    m_peer, r_peer, m_tag);
        rows.push_back({{"size", size},
                        {"deltaserve_mib_s", ours},
                        {"perftest_am_bw_mib_s", am},
                        {"perftest_am_bw_peer_errors_mib_s", am_peer},
                        {"perftest_tag_bw_mib_s", tag},
                        {"ratio_vs_am_bw", r_am},
                        {"ratio_vs_am_bw_peer_errors", r_peer}});
    }
    (*c)->close();
    kill(receiver, SIGTERM);
    waitpid(receiver, nullptr, 0);
    if (!o.json.empty()) {
        nlohmann::json j = {
            {"ucx_tls", tls}, {"bytes_per_run", o.bytes}, {"runs", o.runs}, {"rows", rows}};
        std::ofstream(o.json) << j.dump(2) << "\n";
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
        if (a == "--tls")
            o.tls = next();
        else if (a == "--sizes")
            o.sizes = parse_sizes(next());
        else if (a == "--mib")
            o.bytes = std::stoull(next()) << 20;
        else if (a == "--runs")
            o.runs = std::stoi(next());
        else if (a == "--json")
            o.json = next();
        else if (a == "--receiver")
            o.receiver = true;
        else {
            std::fprintf(stderr,
                         "usage: deltaserve-bench-transport [--tls tcp] [--sizes 65536,1048576] "
                         "[--mib 1024] [--runs 3] [--json FILE]\n");
            return 1;
        }
    }
    return o.receiver ? run_receiver(o) : run_sender(argv[0], o);
}
