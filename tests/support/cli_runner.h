// Runs the deltaserve binary as a child process for end-to-end CLI tests: feeds stdin,
// captures stdout and stderr, and kills the child when it runs past a deadline so that a
// hang fails the test instead of blocking the suite.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "test_paths.h"

extern char** environ;

namespace deltaserve::testing {

struct CliResult {
    int exit_code = -1;      // the exit status; -1 when the child did not exit normally
    int term_signal = 0;     // the signal that ended the child, 0 when it exited
    bool timed_out = false;  // killed by run_deltaserve() at the deadline
    std::string out;
    std::string err;
    std::string spawn_error;  // non-empty when the child could not be started

    // stderr split on '\n' (a trailing newline does not add an empty line).
    std::vector<std::string> err_lines() const {
        std::vector<std::string> lines;
        size_t start = 0;
        while (start < err.size()) {
            size_t nl = err.find('\n', start);
            if (nl == std::string::npos) nl = err.size();
            lines.push_back(err.substr(start, nl - start));
            start = nl + 1;
        }
        return lines;
    }

    // A one-line summary for assertion messages.
    std::string describe() const {
        std::string s = "exit_code=" + std::to_string(exit_code);
        if (term_signal != 0)
            s += " signal=" + std::to_string(term_signal) + " (" + strsignal(term_signal) + ")";
        if (timed_out) s += " TIMED OUT";
        if (!spawn_error.empty()) s += " spawn error: " + spawn_error;
        s += "\n--- stderr ---\n" + err + "--- stdout (" + std::to_string(out.size()) +
             " bytes) ---\n" + out.substr(0, 2000);
        return s;
    }
};

namespace cli_runner_detail {

using Clock = std::chrono::steady_clock;

// Owns the two ends of a pipe; closes them on scope exit.
struct Pipe {
    int fd[2] = {-1, -1};
    bool open() { return pipe2(fd, O_CLOEXEC) == 0; }
    void close_end(int i) {
        if (fd[i] >= 0) ::close(fd[i]);
        fd[i] = -1;
    }
    ~Pipe() {
        close_end(0);
        close_end(1);
    }
};

// Starts `binary args...` with its stdin, stdout and stderr on the pipes; -1 on failure
// (spawn_error set). SIGPIPE is reset to its default action in the child.
inline pid_t spawn(const std::string& binary, const std::vector<std::string>& args, Pipe& in,
                   Pipe& out, Pipe& err, CliResult& r) {
    std::vector<std::string> storage = {binary};
    storage.insert(storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : storage) argv.push_back(a.data());
    argv.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in.fd[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out.fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err.fd[1], STDERR_FILENO);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, binary.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) {
        r.spawn_error = "posix_spawn " + binary + ": " + std::strerror(rc);
        return -1;
    }
    return pid;
}

// Writes stdin_text to in.fd[1] (then closes it) while reading out and err into r, until
// both reach end of file or the deadline passes. Returns false at the deadline.
inline bool pump(const std::string& stdin_text, Pipe& in, Pipe& out, Pipe& err, CliResult& r,
                 Clock::time_point deadline) {
    fcntl(in.fd[1], F_SETFL, O_NONBLOCK);
    size_t written = 0;
    if (stdin_text.empty()) in.close_end(1);
    char buf[65536];
    while (out.fd[0] >= 0 || err.fd[0] >= 0) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() <= 0) return false;
        pollfd fds[3] = {{out.fd[0], POLLIN, 0}, {err.fd[0], POLLIN, 0}, {in.fd[1], POLLOUT, 0}};
        if (poll(fds, 3, static_cast<int>(left.count())) < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (fds[2].revents != 0) {
            const ssize_t n =
                write(in.fd[1], stdin_text.data() + written, stdin_text.size() - written);
            if (n > 0) written += static_cast<size_t>(n);
            if (n < 0 && errno != EAGAIN && errno != EINTR) written = stdin_text.size();  // EPIPE
            if (written == stdin_text.size()) in.close_end(1);
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].revents == 0) continue;
            Pipe& p = i == 0 ? out : err;
            const ssize_t n = read(p.fd[0], buf, sizeof(buf));
            if (n > 0) {
                (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
            } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                p.close_end(0);
            }
        }
    }
    return true;
}

// Waits for the child until the deadline, then kills it; fills the exit fields of r.
inline void reap(pid_t pid, CliResult& r, Clock::time_point deadline) {
    int status = 0;
    for (;;) {
        const pid_t w = waitpid(pid, &status, r.timed_out ? 0 : WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) return;
        if (w == 0 && Clock::now() >= deadline) {
            r.timed_out = true;
            kill(pid, SIGKILL);
        } else if (w == 0) {
            usleep(1000);
        }
    }
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
}

}  // namespace cli_runner_detail

// Runs `deltaserve args...` with stdin_text on its stdin (then closed) and the parent's
// environment; a child still running after `timeout` is killed (timed_out set).
inline CliResult run_binary(const std::string& binary, const std::vector<std::string>& args,
                            const std::string& stdin_text = "",
                            std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    namespace d = cli_runner_detail;
    // The child may exit without reading its stdin; a write then must fail, not kill us.
    static const bool sigpipe_ignored = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();
    (void)sigpipe_ignored;

    CliResult r;
    d::Pipe in, out, err;
    if (!in.open() || !out.open() || !err.open()) {
        r.spawn_error = std::string("pipe2: ") + std::strerror(errno);
        return r;
    }
    const pid_t pid = d::spawn(binary, args, in, out, err, r);
    if (pid < 0) return r;
    in.close_end(0);
    out.close_end(1);
    err.close_end(1);
    const auto deadline = d::Clock::now() + timeout;
    if (!d::pump(stdin_text, in, out, err, r, deadline)) {
        r.timed_out = true;
        kill(pid, SIGKILL);
    }
    in.close_end(1);
    d::reap(pid, r, deadline);
    return r;
}

inline CliResult run_deltaserve(const std::vector<std::string>& args, const std::string& stdin_text = "",
                                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    return run_binary(deltaserve_binary(), args, stdin_text, timeout);
}

}  // namespace deltaserve::testing
