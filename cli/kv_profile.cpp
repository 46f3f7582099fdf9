#include "kv_profile.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "deltaserve/kvstore/kv_policy.h"
#include "run_options.h"

extern char** environ;

namespace deltaserve::cli {

namespace fs = std::filesystem;

namespace {

// deltactl beside this executable (both are built into build/bin).
std::string deltactl_path() {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    return ec ? std::string("deltactl") : (self.parent_path() / "deltactl").string();
}

// Runs `deltactl calibrate --model M [--tokenizer T] --out DIR`, its output on this
// process's stderr.
Status calibrate(const RunOptions& o, const fs::path& out_dir) {
    const std::string& model_path = o.model_path;
    const std::string tool = deltactl_path();
    // DeltaKV's compressors only: TRIM-KV's gates are not needed to run it.
    std::vector<std::string> args = {tool,    "calibrate",      "--model", model_path,
                                     "--out", out_dir.string(), "--steps", "deltakv"};
    if (!o.tokenizer_path.empty()) args.insert(args.end(), {"--tokenizer", o.tokenizer_path});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fprintf(stderr,
                 "deltaserve: no DeltaKV profile for %s; calibrating one into %s "
                 "(deltactl calibrate: minutes on a small model, longer on a large one)\n",
                 model_path.c_str(), out_dir.c_str());
    const auto start = std::chrono::steady_clock::now();
    pid_t pid = 0;
    // serve blocks SIGINT and SIGTERM for its own waiter; the child starts with none blocked,
    // so Ctrl-C stops a calibration (and then this start, which fails).
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    // posix_spawnp: the path is absolute when /proc/self/exe resolves, else found on PATH.
    const int err = posix_spawnp(&pid, tool.c_str(), nullptr, &attr, argv.data(), environ);
    posix_spawnattr_destroy(&attr);
    if (err != 0) {
        return failed_precondition("--kv-calibrate: cannot run " + tool + ": " +
                                   std::string(std::strerror(err)));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        return failed_precondition("--kv-calibrate: deltactl calibrate --model " + model_path +
                                   " --out " + out_dir.string() + " failed (see above)");
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "deltaserve: profile calibrated in %.0f s\n", s);
    return Status();
}

}  // namespace

std::string default_kv_profile(const std::string& model_path, const std::string& policy) {
    auto info = kvstore::find_kv_policy(policy);
    if (!info.ok() || (*info)->profile_file.empty()) return "";
    return (fs::path("profiles") / fs::path(model_path).filename() /
            std::string((*info)->profile_file))
        .string();
}

Status ensure_kv_profile(const RunOptions& o) {
    auto info = kvstore::find_kv_policy(o.kv_policy);
    // Only DeltaKV cannot run without its profile (TRIM-KV's gates are optional).
    if (!info.ok() || (*info)->kind != kvstore::KvCacheKind::kDeltaKv) return Status();
    if (!o.kv_profile.empty()) return Status();  // a given profile is checked as it loads
    const fs::path guess = default_kv_profile(o.model_path, o.kv_policy);
    if (fs::exists(guess)) return Status();
    if (o.kv_calibrate) return calibrate(o, guess.parent_path());
    const std::string model_file = fs::path(o.model_path).filename().string();
    std::string how =
        "deltactl calibrate --model " + o.model_path + " --out " + guess.parent_path().string();
    if (model_file == "SmolLM2-135M-Instruct.Q4_1.gguf") how = "deploy/profile.sh (or " + how + ")";
    return failed_precondition("--kv-policy " + o.kv_policy + " needs a DeltaKV profile of " +
                               model_file + " and there is none at " + guess.string() +
                               ": make one with " + how +
                               ", pass one with --kv-profile, or add --kv-calibrate to make it "
                               "now, before serving");
}

}  // namespace deltaserve::cli
