// Processes that serve until SIGINT or SIGTERM.
#pragma once

#include <signal.h>

namespace deltaserve::cli {

// Blocks SIGINT and SIGTERM in this thread (call before any thread starts, so that threads
// inherit it) and ignores SIGPIPE (a peer that goes away is a write error, not a crash) and
// SIGXFSZ (a file size limit reached by the disk tier is an I/O error it stops admitting on,
// not a crash).
inline sigset_t block_stop_signals() {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &s, nullptr);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    return s;
}

// Waits for one of them; returns its name for the log line.
inline const char* wait_for_stop(const sigset_t& s) {
    int sig = 0;
    sigwait(&s, &sig);
    return sig == SIGINT ? "interrupted" : "terminated";
}

}  // namespace deltaserve::cli
