// A small HTTP/1.1 client over POSIX sockets for end-to-end tests of the gateway: one
// request per connection (Connection: close), chunked bodies decoded, raw bytes possible.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace deltaserve::testing {

struct HttpResponse {
    int status = 0;  // 0: no response (connection failed or closed early)
    std::map<std::string, std::string> headers;  // names lower-cased
    std::string body;
};

// Sends raw bytes to 127.0.0.1:port and reads until the server closes (or timeout_ms
// passes). Returns what came back, undecoded; stop_after > 0 closes once that many bytes
// arrived (a client going away mid-answer).
inline std::string http_raw(uint16_t port, const std::string& bytes, int timeout_ms = 120000,
                            size_t stop_after = 0) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return "";
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        size_t sent = 0;
        while (sent < bytes.size()) {
            const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) break;
            sent += static_cast<size_t>(n);
        }
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        char buf[8192];
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            pollfd p{fd, POLLIN, 0};
            if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
            const ssize_t n = recv(fd, buf, sizeof buf, 0);
            if (n <= 0) break;
            out.append(buf, static_cast<size_t>(n));
            if (stop_after > 0 && out.size() >= stop_after) break;
        }
    }
    close(fd);
    return out;
}

// Parses a whole response: status line, headers, body (chunked transfer decoded).
inline HttpResponse parse_http_response(const std::string& raw) {
    HttpResponse r;
    const size_t head_end = raw.find("\r\n\r\n");
    if (raw.compare(0, 5, "HTTP/") != 0 || head_end == std::string::npos) return r;
    r.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
    size_t at = raw.find("\r\n") + 2;
    while (at < head_end) {
        const size_t eol = raw.find("\r\n", at);
        const std::string line = raw.substr(at, eol - at);
        const size_t colon = line.find(':');
        if (colon != std::string::npos) {
            std::string name = line.substr(0, colon);
            for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
        }
        at = eol + 2;
    }
    std::string body = raw.substr(head_end + 4);
    if (r.headers["transfer-encoding"] == "chunked") {
        std::string decoded;
        size_t p = 0;
        for (;;) {
            const size_t eol = body.find("\r\n", p);
            if (eol == std::string::npos) break;
            const size_t n = std::stoul(body.substr(p, eol - p), nullptr, 16);
            if (n == 0) break;
            decoded += body.substr(eol + 2, n);
            p = eol + 2 + n + 2;
        }
        body = decoded;
    }
    r.body = body;
    return r;
}

inline HttpResponse http_request(uint16_t port, const std::string& method,
                                 const std::string& target, const std::string& body = "",
                                 const std::string& extra_headers = "") {
    std::string req = method + " " + target +
                      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + extra_headers;
    if (!body.empty() || method == "POST") {
        req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
               "\r\n";
    }
    return parse_http_response(http_raw(port, req + "\r\n" + body));
}

}  // namespace deltaserve::testing
