#include "etcd_http.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include "etcd_json.h"

namespace deltaserve::api::etcd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr uint32_t kMaxHeaderBytes = 64 * 1024;

std::string where(const Endpoint& e) { return e.host + ":" + e.port; }

Status transport_error(const Endpoint& e, const beast::error_code& ec, const char* doing) {
    const std::string m = std::string("etcd ") + where(e) + ": " + doing + ": " + ec.message();
    if (ec == beast::error::timeout) return deadline_exceeded(m);
    return unavailable(m);
}

http::request<http::string_body> make_request(const Endpoint& e, std::string_view path,
                                              const std::string& body, const std::string& token) {
    http::request<http::string_body> req{http::verb::post, std::string(path), 11};
    req.set(http::field::host, where(e));
    req.set(http::field::content_type, "application/json");
    if (!token.empty()) req.set(http::field::authorization, token);
    // gRPC metadata through the gateway: a member that has lost its leader refuses (and ends
    // its watches) instead of serving a stale view, as clientv3's WithRequireLeader asks.
    req.set("Grpc-Metadata-hasleader", "true");
    req.body() = body;
    req.prepare_payload();
    return req;
}

}  // namespace

Result<Endpoint> parse_endpoint(std::string_view text) {
    std::string_view t = text;
    if (t.substr(0, 7) == "http://") t.remove_prefix(7);
    if (text.substr(0, 8) == "https://") {
        return unimplemented("etcd endpoint '" + std::string(text) +
                             "': TLS to etcd is not implemented (use http:// inside the cluster's "
                             "network, or a local TLS proxy)");
    }
    while (!t.empty() && t.back() == '/') t.remove_suffix(1);
    const size_t colon = t.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == t.size()) {
        return invalid_argument("etcd endpoint '" + std::string(text) + "' is not host:port");
    }
    Endpoint e{std::string(t.substr(0, colon)), std::string(t.substr(colon + 1))};
    if (e.port.size() > 5 || e.port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(e.port) == 0 || std::stoi(e.port) > 65535) {
        return invalid_argument("etcd endpoint '" + std::string(text) + "' has no valid port");
    }
    if (e.host.front() == '[' && e.host.back() == ']') e.host = e.host.substr(1, e.host.size() - 2);
    if (e.host.find_first_of("/ @?#") != std::string::npos) {
        return invalid_argument("etcd endpoint '" + std::string(text) + "' is not host:port");
    }
    return e;
}

Result<Answer> post(const Endpoint& endpoint, std::string_view path, const std::string& body,
                    const std::string& token, std::chrono::milliseconds timeout) {
    asio::io_context ioc;
    beast::tcp_stream stream(ioc);
    tcp::resolver resolver(ioc);
    beast::error_code ec;
    const auto addresses = resolver.resolve(endpoint.host, endpoint.port, ec);
    if (ec) return transport_error(endpoint, ec, "resolving");
    const auto req = make_request(endpoint, path, body, token);
    http::response_parser<http::string_body> parser;
    parser.body_limit(kMaxAnswerBytes);
    parser.header_limit(kMaxHeaderBytes);
    beast::flat_buffer buffer;
    const char* doing = "connecting";
    stream.expires_after(timeout);
    stream.async_connect(addresses, [&](beast::error_code e, const tcp::endpoint&) {
        if (e) {
            ec = e;
            return;
        }
        doing = "sending";
        http::async_write(stream, req, [&](beast::error_code e2, size_t) {
            if (e2) {
                ec = e2;
                return;
            }
            doing = "reading the answer";
            http::async_read(stream, buffer, parser,
                             [&](beast::error_code e3, size_t) { ec = e3; });
        });
    });
    ioc.run();
    if (ec) return transport_error(endpoint, ec, doing);
    Answer a;
    a.status = parser.get().result_int();
    a.body = std::move(parser.get().body());
    return a;
}

Stream::Stream() : stream_(ioc_) {
    on_chunk_ = [this](uint64_t, beast::string_view piece, beast::error_code& e) -> size_t {
        if (pending_.size() + piece.size() > kMaxAnswerBytes) {
            e = http::error::body_limit;
            return 0;
        }
        pending_.append(piece.data(), piece.size());
        return piece.size();
    };
}

Stream::~Stream() {
    // Runs what the closed socket aborts, so no handler outlives the members it points to.
    beast::error_code ec;
    stream_.socket().close(ec);
    ioc_.restart();
    ioc_.poll();
}

bool Stream::run() {
    ioc_.restart();
    if (cancelled_.load()) return false;
    ioc_.run();
    return !cancelled_.load() || done_;
}

Status Stream::open(const Endpoint& endpoint, std::string_view path, const std::string& body,
                    const std::string& token, std::chrono::milliseconds timeout) {
    endpoint_ = endpoint;
    tcp::resolver resolver(ioc_);
    beast::error_code ec;
    const auto addresses = resolver.resolve(endpoint.host, endpoint.port, ec);
    if (ec) return transport_error(endpoint, ec, "resolving");
    request_ = make_request(endpoint, path, body, token);
    parser_.emplace();
    parser_->body_limit(kMaxAnswerBytes);
    parser_->header_limit(kMaxHeaderBytes);
    parser_->on_chunk_body(on_chunk_);
    done_ = false;
    doing_ = "connecting";
    stream_.expires_after(timeout);
    stream_.async_connect(addresses, [this](beast::error_code e, const tcp::endpoint&) {
        if (e) return finish(e);
        doing_ = "sending";
        http::async_write(stream_, request_, [this](beast::error_code e2, size_t) {
            if (e2) return finish(e2);
            doing_ = "reading the answer's head";
            http::async_read_header(stream_, buffer_, *parser_,
                                    [this](beast::error_code e3, size_t) { finish(e3); });
        });
    });
    if (!run()) return aborted("the etcd stream was cancelled");
    if (ec_) return transport_error(endpoint, ec_, doing_);
    const unsigned status = parser_->get().result_int();
    if (status == 200) return Status();
    // An error answer: read its body (whole, under the same deadline) for etcd's message.
    done_ = false;
    http::async_read(stream_, buffer_, *parser_,
                     [this](beast::error_code e, size_t) { finish(e); });
    if (!run()) return aborted("the etcd stream was cancelled");
    return error_of(status, pending_.empty() ? parser_->get().body() : pending_);
}

void Stream::finish(const beast::error_code& ec) {
    ec_ = ec;
    done_ = true;
}

Result<std::optional<std::string>> Stream::next(std::chrono::milliseconds idle) {
    while (true) {
        if (cancelled_.load()) return aborted("the etcd stream was cancelled");
        // A body that is not chunked goes to the parser's string.
        if (!parser_->chunked() && !parser_->get().body().empty()) {
            pending_ += parser_->get().body();
            parser_->get().body().clear();
        }
        const size_t nl = pending_.find('\n');
        if (nl != std::string::npos || (ended_ && !pending_.empty())) {
            std::string message = pending_.substr(0, nl);
            pending_.erase(0, nl == std::string::npos ? std::string::npos : nl + 1);
            if (message.find_first_not_of(" \r\t") == std::string::npos) continue;
            return std::optional<std::string>(std::move(message));
        }
        if (ended_) return std::optional<std::string>();
        done_ = false;
        stream_.expires_after(idle);
        http::async_read_some(stream_, buffer_, *parser_,
                              [this](beast::error_code e, size_t) { finish(e); });
        if (!run()) return aborted("the etcd stream was cancelled");
        if (ec_ == http::error::end_of_stream || parser_->is_done()) {
            ended_ = true;
            continue;
        }
        if (ec_ == beast::error::timeout) {
            return deadline_exceeded("etcd " + endpoint_.host + ":" + endpoint_.port +
                                     ": no byte of the stream for " + std::to_string(idle.count()) +
                                     " ms");
        }
        if (ec_) return transport_error(endpoint_, ec_, "reading the stream");
    }
}

void Stream::cancel() {
    cancelled_.store(true);
    ioc_.stop();
}

}  // namespace deltaserve::api::etcd
