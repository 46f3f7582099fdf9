// Shipment throughput of the UCX transport against ucx_perftest on the same link.
//
// Two processes, as a prefill and a decode node would be: this program spawns itself as the
// receiver, sends `--mib` worth of messages of each size from pool buffers, and times until
// the receiver acknowledges the last one. It does so once per rendezvous scheme in
// `--schemes` (each with its own receiver and connection; the first, by default UCX's own
// choice as the transport makes it, is the headline). In the same run, alternating with it,
// ucx_perftest measures UCP active-message bandwidth (ucp_am_bw, the protocol the transport
// uses) twice, with UCX's default endpoints and with UCX configured as the transport
// configures it (peer error handling, -e; UCX_MM_ERROR_HANDLING=y; the headline scheme), and
// tag-matching bandwidth (tag_bw), with the same UCX_TLS, message size and count. Ratios are
// the median of each run's ratio (a run's arms are seconds apart; this VM's speed drifts over
// minutes). Prints a table and, with --json, a summary. MiB/s throughout (ucx_perftest's
// "MB/s" are MiB/s).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
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
    std::vector<std::string> schemes = {"auto", "get_zcopy"};  // --schemes; the default first
    std::string scheme;                                        // the receiver's (--scheme)
    bool receiver = false;
    bool perftest = true;  // --no-perftest: the transport alone (for profiling it)
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

TransportOptions transport_options(const Options& o, const std::string& scheme) {
    TransportOptions t;
    t.ucx_tls = o.tls;
    t.pool_bytes = size_t{256} << 20;
    t.ucx_rndv_scheme = scheme;
    return t;
}

// The receiving process: prints its address, then acknowledges every "done".
int run_receiver(const Options& o) {
    auto t = make_transport("ucx", transport_options(o, o.scheme));
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
std::string run_capture(std::vector<std::string> args, pid_t* background = nullptr,
                        char** envp = environ) {
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
    const int rc = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), envp);
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

// The environment with `extra` ("KEY=value") added, replacing the same keys.
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
        const std::string kv = *e;
        const std::string key = kv.substr(0, kv.find('=') + 1);
        const bool replaced = std::any_of(
            extra.begin(), extra.end(), [&](const std::string& x) { return x.rfind(key, 0) == 0; });
        if (!replaced) env.push_back(kv);
    }
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
}

// ucx_perftest's overall bandwidth (MiB/s) for one test, or -1. `configured`: UCX set up as
// the transport sets it up: peer error handling (-e, UCP_ERR_HANDLING_MODE_PEER), shared
// memory allowed with it, and the transport's rendezvous scheme.
double perftest(const std::string& test, size_t size, size_t count, int port, bool configured,
                const std::string& scheme) {
    const bool peer_errors = configured;
    std::vector<std::string> extra;
    if (configured) {
        // "": the UCX_TLS run_sender set, as the transport reads it.
        if (ucx_tls_has_shared_memory("")) extra.push_back("UCX_MM_ERROR_HANDLING=y");
        if (getenv("UCX_RNDV_SCHEME") == nullptr) extra.push_back("UCX_RNDV_SCHEME=" + scheme);
    }
    std::vector<std::string> env_strings = environment_with(extra);
    std::vector<char*> envp;
    for (auto& e : env_strings) envp.push_back(e.data());
    envp.push_back(nullptr);
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
    const int rc =
        posix_spawnp(&server, "ucx_perftest", &actions, nullptr, sargv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) return -1;
    std::string out;
    for (int attempt = 0; attempt < 50; ++attempt) {
        usleep(100000);
        std::vector<std::string> args = {"ucx_perftest", "127.0.0.1", "-p", p, "-t", test};
        args.insert(args.end(), {"-s", std::to_string(size), "-n", std::to_string(count)});
        if (peer_errors) args.push_back("-e");
        out = run_capture(args, nullptr, envp.data());
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

double best(const std::vector<double>& v) {
    return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// The median of a[i] / b[i] over the runs where both were measured.
double median_ratio(const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> r;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        if (a[i] > 0 && b[i] > 0) r.push_back(a[i] / b[i]);
    }
    return median(r);
}

std::vector<std::string> parse_list(const std::string& s) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos < s.size()) {
        size_t end = s.find(',', pos);
        if (end == std::string::npos) end = s.size();
        out.push_back(s.substr(pos, end - pos));
        pos = end + 1;
    }
    return out;
}

std::vector<size_t> parse_sizes(const std::string& s) {
    std::vector<size_t> out;
    for (const std::string& x : parse_list(s)) out.push_back(std::stoull(x));
    return out;
}

// One arm of ours: a receiver process and a connection to it, with one rendezvous scheme.
struct Arm {
    std::string scheme;
    pid_t receiver = 0;
    std::unique_ptr<Transport> transport;
    std::unique_ptr<Connection> conn;
};

int run_sender(const char* self, const Options& o) {
    // The receivers and ucx_perftest see the same transports (empty: UCX's own choice).
    if (o.tls.empty()) {
        unsetenv("UCX_TLS");
    } else {
        setenv("UCX_TLS", (o.tls.find("tcp") == std::string::npos ? o.tls + ",tcp" : o.tls).c_str(),
               1);
    }
    std::vector<Arm> arms;
    auto stop = [&arms] {
        for (Arm& a : arms) {
            if (a.conn) a.conn->close();
            if (a.receiver > 0) kill(a.receiver, SIGTERM), waitpid(a.receiver, nullptr, 0);
        }
    };
    for (const std::string& scheme : o.schemes) {
        Arm a;
        a.scheme = scheme;
        const std::string address =
            run_capture({self, "--receiver", "--tls", o.tls, "--scheme", scheme}, &a.receiver);
        arms.push_back(std::move(a));
        if (address.empty()) return stop(), std::fprintf(stderr, "a receiver did not start\n"), 2;
        auto t = make_transport("ucx", transport_options(o, scheme));
        if (!t.ok()) return stop(), std::fprintf(stderr, "%s\n", t.error().to_string().c_str()), 2;
        arms.back().transport = std::move(*t);
        auto c = arms.back().transport->connect(address, deadline_in(30s));
        if (!c.ok()) return stop(), std::fprintf(stderr, "%s\n", c.error().to_string().c_str()), 2;
        arms.back().conn = std::move(*c);
    }

    nlohmann::json rows = nlohmann::json::array();
    const std::string tls = getenv("UCX_TLS") ? getenv("UCX_TLS") : "(UCX default)";
    const char* forced = getenv("UCX_RNDV_SCHEME");
    std::printf(
        "UCX_TLS=%s, %zu MiB per size and run, %d runs: median MiB/s, median of the "
        "runs' ratios%s\n",
        tls.c_str(), o.bytes >> 20, o.runs,
        forced ? (std::string(", UCX_RNDV_SCHEME=") + forced + " for every arm").c_str() : "");
    std::printf("%10s", "size");
    for (const Arm& a : arms) std::printf(" %14s", ("ours " + a.scheme).c_str());
    std::printf(" %10s %6s %18s %6s %10s\n", "am_bw", "ratio", "am_bw as ours", "ratio", "tag_bw");
    int port = 20000 + getpid() % 20000;
    const std::string& headline = o.schemes.front();
    for (size_t size : o.sizes) {
        const size_t count = std::max<size_t>(o.bytes / size, 16);
        std::vector<std::vector<double>> ours(arms.size());
        std::vector<double> am, am_configured, tag;
        for (Arm& a : arms) {
            if (auto warm = send_round(*a.transport, *a.conn, size, std::min<size_t>(count, 64));
                !warm.ok()) {
                return stop(), std::fprintf(stderr, "%s\n", warm.error().to_string().c_str()), 2;
            }
        }
        for (int r = 0; r < o.runs; ++r) {
            for (size_t k = 0; k < arms.size(); ++k) {
                auto bw = send_round(*arms[k].transport, *arms[k].conn, size, count);
                if (!bw.ok()) {
                    return stop(), std::fprintf(stderr, "%s\n", bw.error().to_string().c_str()), 2;
                }
                ours[k].push_back(*bw);
            }
            if (!o.perftest) continue;
            am.push_back(perftest("ucp_am_bw", size, count, port++, false, headline));
            am_configured.push_back(perftest("ucp_am_bw", size, count, port++, true, headline));
            tag.push_back(perftest("tag_bw", size, count, port++, false, headline));
        }
        const double r_am = median_ratio(ours[0], am),
                     r_conf = median_ratio(ours[0], am_configured);
        std::printf("%10zu", size);
        for (const auto& v : ours) std::printf(" %14.0f", median(v));
        std::printf(" %10.0f %6.2f %18.0f %6.2f %10.0f\n", median(am), r_am, median(am_configured),
                    r_conf, median(tag));
        // On a small VM both ucx_perftest and the transport switch between a slow and a fast
        // mode from run to run (scheduling of the two processes' threads): the best runs too.
        const double b_ours = best(ours[0]), b_am = best(am), b_conf = best(am_configured);
        std::printf("%10s", "best");
        for (const auto& v : ours) std::printf(" %14.0f", best(v));
        std::printf(" %10.0f %6.2f %18.0f %6.2f %10.0f\n", b_am, b_am > 0 ? b_ours / b_am : 0.0,
                    b_conf, b_conf > 0 ? b_ours / b_conf : 0.0, best(tag));
        nlohmann::json row = {
            {"size", size},
            {"perftest_am_bw_mib_s", am},
            {"perftest_am_bw_configured_mib_s", am_configured},
            {"perftest_tag_bw_mib_s", tag},
            {"ratio_vs_am_bw", r_am},
            {"ratio_vs_am_bw_configured", r_conf},
            {"best_ratio_vs_am_bw", b_am > 0 ? b_ours / b_am : 0.0},
            {"best_ratio_vs_am_bw_configured", b_conf > 0 ? b_ours / b_conf : 0.0}};
        for (size_t k = 0; k < arms.size(); ++k) {
            row["deltaserve_" + arms[k].scheme + "_mib_s"] = ours[k];
            if (k > 0)
                row["ratio_" + arms[k].scheme + "_vs_" + headline] = median_ratio(ours[k], ours[0]);
        }
        rows.push_back(row);
    }
    stop();
    if (!o.json.empty()) {
        nlohmann::json j = {{"ucx_tls", tls},       {"ucx_rndv_scheme_env", forced ? forced : ""},
                            {"schemes", o.schemes}, {"bytes_per_run", o.bytes},
                            {"runs", o.runs},       {"rows", rows}};
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
        else if (a == "--schemes")
            o.schemes = parse_list(next());
        else if (a == "--scheme")
            o.scheme = next();
        else if (a == "--no-perftest")
            o.perftest = false;
        else if (a == "--receiver")
            o.receiver = true;
        else {
            std::fprintf(stderr,
                         "usage: deltaserve-bench-transport [--tls tcp] [--sizes 65536,1048576] "
                         "[--mib 1024] [--runs 3] [--schemes auto,get_zcopy] [--json FILE] "
                         "[--no-perftest]\n");
            return 1;
        }
    }
    if (o.schemes.empty()) return std::fprintf(stderr, "--schemes names no scheme\n"), 1;
    return o.receiver ? run_receiver(o) : run_sender(argv[0], o);
}
