// The dashboard's HTTP server: access checks, routes, and the answers of dashboard_views as JSON, SVG and files.
#include "runtime/serve/dashboard_server.h"

#include <arpa/inet.h>

#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>

#include "runtime/core/json_text.h"
#include "runtime/index/index_database.h"
#include "runtime/report/html_report.h"
#include "runtime/serve/dashboard_assets.h"
#include "runtime/serve/dashboard_views.h"
#include "runtime/serve/guarded_http_server.h"

namespace runner::serve {
namespace {

// The pages: one document whose script draws the page its path names.
bool is_page_path(const std::string& path) {
  return path == "/" || path == "/compare" || path == "/sweeps" || path.rfind("/run/", 0) == 0 ||
         path.rfind("/sweep/", 0) == 0;
}

std::string random_token() {
  std::random_device device;  // /dev/urandom
  std::string token;
  for (int i = 0; i < 4; ++i) token += fmt::format("{:08x}", device());
  return token;
}

// Compares in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i) difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
}

std::string cookie_value(const httplib::Request& request, const std::string& name) {
  const std::string cookies = request.get_header_value("Cookie");
  std::size_t start = 0;
  while (start < cookies.size()) {
    std::size_t end = cookies.find(';', start);
    if (end == std::string::npos) end = cookies.size();
    std::string pair = cookies.substr(start, end - start);
    pair.erase(0, pair.find_first_not_of(' '));
    if (pair.rfind(name + "=", 0) == 0) return pair.substr(name.size() + 1);
    start = end + 1;
  }
  return "";
}

// The host part of a Host header: "127.0.0.1:8765" -> "127.0.0.1", "[::1]:80" -> "::1".
std::string host_name_of(const std::string& header) {
  if (!header.empty() && header[0] == '[') return header.substr(1, header.find(']') - 1);
  return header.substr(0, header.find(':'));
}

QueryParameters query_parameters(const httplib::Request& request) {
  QueryParameters parameters;
  for (const auto& [name, value] : request.params) parameters.emplace(name, value);
  return parameters;
}

std::string read_file(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw NotFound(fmt::format("{}: cannot read the file the index lists", path));
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

std::string image_type(const std::string& path) {
  auto ends_with = [&](const char* suffix) {
    const std::string s = suffix;
    return path.size() >= s.size() && path.compare(path.size() - s.size(), s.size(), s) == 0;
  };
  if (ends_with(".png")) return "image/png";
  if (ends_with(".jpg") || ends_with(".jpeg")) return "image/jpeg";
  return "application/octet-stream";
}

}  // namespace

bool is_loopback_address(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr address{};
  return inet_pton(AF_INET, host.c_str(), &address) == 1 && (ntohl(address.s_addr) >> 24) == 127;
}

struct DashboardServer::State {
  ServeOptions options;
  std::string token;
  int port = 0;
  GuardedHttpServer http;

  // Per port: browsers send a host's cookies to all its ports, and two servers on one host have two tokens.
  std::string token_cookie() const { return fmt::format("runner_token_{}", port); }

  // Whether the request may be answered; else the refusal is in `response`.
  bool allowed(const httplib::Request& request, httplib::Response& response) {
    if (request.method != "GET" && request.method != "HEAD") {
      response.status = 405;
      response.set_header("Allow", "GET, HEAD");
      response.set_content(fmt::format("runner serve is read-only: {} is not answered\n", request.method),
                           "text/plain; charset=utf-8");
      return false;
    }
    if (is_loopback_address(options.host)) {
      const std::string host = host_name_of(request.get_header_value("Host"));
      if (!is_loopback_address(host) && host != options.host) {
        response.status = 403;
        response.set_content(fmt::format("runner serve answers on {} only to requests for a loopback host, not '{}'\n",
                                         options.host, host),
                             "text/plain; charset=utf-8");
        return false;
      }
    }
    if (token.empty()) return true;
    const std::string given = request.has_param("token") ? request.get_param_value("token") : "";
    if (same_secret(given, token)) {
      response.set_header("Set-Cookie", fmt::format("{}={}; Path=/; HttpOnly; SameSite=Strict", token_cookie(), token));
      return true;
    }
    if (same_secret(cookie_value(request, token_cookie()), token)) return true;
    response.status = 403;
    response.set_content(
        "runner serve: requests need the token that `runner serve` printed at its start: open the URL it printed "
        "(...?token=...), or start it with --no-token (loopback only)\n",
        "text/plain; charset=utf-8");
    return false;
  }

  // Runs `answer` on a fresh read-only connection to the index, turning errors into 400, 404 and 500 answers.
  template <typename Answer>
  void with_index(httplib::Response& response, Answer answer) {
    response.set_header("Cache-Control", "no-store");
    try {
      index::Database db = index::open_index_for_reading(options.index);
      answer(db);
    } catch (const BadRequest& error) {
      response.status = 400;
      response.set_content(std::string(error.what()) + "\n", "text/plain; charset=utf-8");
    } catch (const NotFound& error) {
      response.status = 404;
      response.set_content(std::string(error.what()) + "\n", "text/plain; charset=utf-8");
    } catch (const std::exception& error) {
      response.status = 500;
      response.set_content(std::string(error.what()) + "\n", "text/plain; charset=utf-8");
    }
  }

  template <typename Page>
  void json_route(const char* path, Page page) {
    http.Get(path, [this, page](const httplib::Request& request, httplib::Response& response) {
      with_index(response, [&](index::Database& db) {
        const nlohmann::json answer = page(db, query_parameters(request));
        const std::string since = request.has_param("since") ? request.get_param_value("since") : "";
        if (!since.empty() && since == answer["version"].get<std::string>())
          response.set_content(core::json_text(nlohmann::json{{"version", since}, {"unchanged", true}}),
                               "application/json");
        else
          response.set_content(core::json_text(answer), "application/json");
      });
    });
  }

  void add_routes() {
    http.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
      response.set_header("X-Content-Type-Options", "nosniff");
      response.set_header("Referrer-Policy", "no-referrer");
      response.set_header("Content-Security-Policy",
                          "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self'; frame-ancestors "
                          "'none'");
      return allowed(request, response) ? httplib::Server::HandlerResponse::Unhandled
                                        : httplib::Server::HandlerResponse::Handled;
    });
    http.Get("/assets/report.css", [](const httplib::Request&, httplib::Response& response) {
      response.set_content(report::report_style(), "text/css; charset=utf-8");
    });
    http.Get(R"(/assets/([a-z_.]+))", [](const httplib::Request& request, httplib::Response& response) {
      const DashboardAsset* asset = find_asset(request.matches[1].str());
      if (asset == nullptr) {
        response.status = 404;
        response.set_content("no such asset\n", "text/plain; charset=utf-8");
        return;
      }
      response.set_content(std::string(asset->content), std::string(asset->content_type));
    });
    json_route("/api/runs", runs_page);
    json_route("/api/run", run_page);
    json_route("/api/compare", compare_page);
    json_route("/api/groups", groups_page);
    json_route("/api/sweeps", sweeps_page);
    json_route("/api/sweep", sweep_page);
    http.Get("/chart/metric.svg", [this](const httplib::Request& request, httplib::Response& response) {
      with_index(response, [&](index::Database& db) {
        response.set_content(metric_chart(db, options.index.home, query_parameters(request)), "image/svg+xml");
      });
    });
    http.Get("/chart/sweep.svg", [this](const httplib::Request& request, httplib::Response& response) {
      with_index(response, [&](index::Database& db) {
        response.set_content(sweep_chart(db, query_parameters(request)), "image/svg+xml");
      });
    });
    http.Get("/chart/histogram.svg", [this](const httplib::Request& request, httplib::Response& response) {
      with_index(response, [&](index::Database& db) {
        response.set_content(histogram_chart(db, query_parameters(request)), "image/svg+xml");
      });
    });
    http.Get("/image", [this](const httplib::Request& request, httplib::Response& response) {
      with_index(response, [&](index::Database& db) {
        const std::string path = image_file(db, options.index.home, query_parameters(request));
        response.set_content(read_file(path), image_type(path));
      });
    });
    // Every page is the one document, whose script reads the path; routes are tried in order, so this one last.
    http.Get(".*", [this](const httplib::Request& request, httplib::Response& response) {
      if (!is_page_path(request.path)) {
        response.status = 404;
        response.set_content(fmt::format("runner serve: no page '{}'\n", request.path), "text/plain; charset=utf-8");
        return;
      }
      const DashboardAsset* page = find_asset("dashboard.html");
      response.set_header("Cache-Control", "no-store");
      response.set_content(std::string(page->content), std::string(page->content_type));
    });
  }
};

const DashboardAsset* find_asset(std::string_view name) {
  for (const DashboardAsset& asset : dashboard_assets())
    if (asset.name == name) return &asset;
  return nullptr;
}

DashboardServer::DashboardServer(ServeOptions options) : state_(std::make_unique<State>()) {
  state_->options = std::move(options);
  if (state_->options.token) state_->token = random_token();
  state_->http.set_payload_max_length(64 * 1024);
  // cpp-httplib's default sets SO_REUSEPORT, with which a second server on the port starts too and the kernel
  // splits the connections between the two: SO_REUSEADDR alone (a restart may take the port of one just ended).
  state_->http.set_socket_options([](socket_t socket) {
    const int yes = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  state_->add_routes();
}

DashboardServer::~DashboardServer() = default;

void DashboardServer::bind() {
  const ServeOptions& options = state_->options;
  const std::string host = options.host == "localhost" ? "127.0.0.1" : options.host;
  if (options.port == 0) {
    state_->port = state_->http.bind_to_any_port(host);
  } else {
    state_->port = state_->http.bind_to_port(host, options.port) ? options.port : -1;
  }
  if (state_->port <= 0)
    throw std::runtime_error(
        fmt::format("cannot listen on {}:{}: the port is in use, or the address is not this machine's "
                    "(--port 0 picks a free port)",
                    options.host, options.port));
}

int DashboardServer::port() const { return state_->port; }

const std::string& DashboardServer::token() const { return state_->token; }

std::string DashboardServer::url() const { return url(state_->options.host); }

std::string DashboardServer::url(const std::string& host) const {
  const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return fmt::format("http://{}:{}/{}", shown, state_->port, state_->token.empty() ? "" : "?token=" + state_->token);
}

void DashboardServer::run() { state_->http.listen_after_bind(); }

void DashboardServer::stop() { state_->http.stop(); }

}  // namespace runner::serve
