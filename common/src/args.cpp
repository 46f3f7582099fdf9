#include "deltaserve/common/args.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string_view>

namespace deltaserve {

namespace {
template <typename T>
std::string show(T* p) {
    std::ostringstream s;
    s << *p;
    return s.str();
}
}  // namespace

void ArgParser::add(const std::string& name, std::string* t, const std::string& help) {
    flags_.push_back({name, t, help, t->empty() ? "" : "\"" + *t + "\""});
}
void ArgParser::add(const std::string& name, int32_t* t, const std::string& help) {
    flags_.push_back({name, t, help, show(t)});
}
void ArgParser::add(const std::string& name, uint64_t* t, const std::string& help) {
    flags_.push_back({name, t, help, ""});
}
void ArgParser::add(const std::string& name, float* t, const std::string& help) {
    flags_.push_back({name, t, help, show(t)});
}
void ArgParser::add_switch(const std::string& name, bool* t, const std::string& help) {
    flags_.push_back({name, t, help, ""});
}
void ArgParser::add_list(const std::string& name, std::vector<std::string>* t,
                         const std::string& help) {
    flags_.push_back({name, t, help, ""});
}

Status ArgParser::set(Flag& f, const std::string& value) {
    auto bad = [&](const char* what) {
        return invalid_argument("--" + f.name + ": '" + value + "' is not " + what);
    };
    const bool list = std::holds_alternative<std::vector<std::string>*>(f.target);
    if (f.seen && !list) return invalid_argument("--" + f.name + " is given twice");
    f.seen = true;
    if (list) {
        auto& items = *std::get<std::vector<std::string>*>(f.target);
        for (std::string& item : split_comma_list(value)) items.push_back(std::move(item));
    } else if (auto* s = std::get_if<std::string*>(&f.target)) {
        **s = value;
    } else if (auto* i = std::get_if<int32_t*>(&f.target)) {
        int32_t v = 0;
        auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (ec != std::errc() || p != value.data() + value.size()) return bad("an integer");
        **i = v;
    } else if (auto* u = std::get_if<uint64_t*>(&f.target)) {
        uint64_t v = 0;
        auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (ec != std::errc() || p != value.data() + value.size())
            return bad("a non-negative integer");
        **u = v;
    } else if (auto* fl = std::get_if<float*>(&f.target)) {
        char* end = nullptr;
        const float v = std::strtof(value.c_str(), &end);
        if (value.empty() || end != value.c_str() + value.size()) return bad("a number");
        **fl = v;
    }
    return Status();
}

Status ArgParser::parse(int argc, char** argv) {
    for (int i = 0; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            help_ = true;
            return Status();
        }
        if (arg.rfind("--", 0) != 0) {
            return invalid_argument("unexpected argument '" + arg + "' (see " + command_ +
                                    " --help)");
        }
        std::string name = arg.substr(2), value;
        bool has_value = false;
        if (auto eq = name.find('='); eq != std::string::npos) {
            value = name.substr(eq + 1);
            name = name.substr(0, eq);
            has_value = true;
        }
        Flag* flag = nullptr;
        for (auto& f : flags_) {
            if (f.name == name) flag = &f;
        }
        if (flag == nullptr) {
            return invalid_argument("unknown flag --" + name + " (see " + command_ + " --help)");
        }
        if (auto* b = std::get_if<bool*>(&flag->target)) {
            if (has_value) return invalid_argument("--" + name + " takes no value");
            if (flag->seen) return invalid_argument("--" + name + " is given twice");
            **b = true;
            flag->seen = true;
            continue;
        }
        if (!has_value) {
            if (i + 1 >= argc) return invalid_argument("--" + name + " needs a value");
            value = argv[++i];
        }
        DS_RETURN_IF_ERROR(set(*flag, value));
    }
    return Status();
}

bool ArgParser::given(const std::string& name) const {
    for (const auto& f : flags_) {
        if (f.name == name) return f.seen;
    }
    return false;
}

std::string ArgParser::usage() const {
    std::ostringstream s;
    s << "usage: " << command_ << " [flags]\n\n" << summary_ << "\n\nflags:\n";
    for (const auto& f : flags_) {
        std::string left = "  --" + f.name;
        if (std::holds_alternative<std::vector<std::string>*>(f.target)) {
            left += " VALUE...";
        } else if (!std::holds_alternative<bool*>(f.target)) {
            left += " VALUE";
        }
        s << left;
        for (size_t n = left.size(); n < 26; ++n) s << ' ';
        s << ' ' << f.help;
        if (!f.default_text.empty()) s << " (default " << f.default_text << ")";
        if (std::holds_alternative<std::vector<std::string>*>(f.target))
            s << " (may be given more than once)";
        s << '\n';
    }
    s << "  --help                     show this help\n";
    return s.str();
}

std::vector<std::string> split_comma_list(std::string_view list) {
    std::vector<std::string> items;
    while (!list.empty()) {
        const size_t comma = list.find(',');
        std::string_view item = list.substr(0, comma);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        if (!item.empty()) items.emplace_back(item);
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    return items;
}

std::optional<int> parse_flags(ArgParser& p, int argc, char** argv) {
    if (Status s = p.parse(argc, argv); !s.ok()) {
        std::fprintf(stderr, "deltaserve: error: %s\n", s.message().c_str());
        return 2;
    }
    if (p.help_requested()) {
        std::fputs(p.usage().c_str(), stdout);
        return 0;
    }
    return std::nullopt;
}

}  // namespace deltaserve
