// `runner serve`: the dashboard over the index, until Ctrl-C (or SIGTERM, SIGHUP).
#include "runtime/serve/serve_command.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <fmt/format.h>
#include <string>
#include <thread>
#include <vector>

#include "runtime/cli/command_support.h"
#include "runtime/cli/index_commands.h"
#include "runtime/index/index_database.h"
#include "runtime/serve/dashboard_server.h"

namespace runner::serve {
namespace {

bool is_any_address(const std::string& host) { return host == "0.0.0.0" || host == "::"; }

// Where other machines may reach a server listening on every address (`host` 0.0.0.0, or :: with IPv6 too): this
// machine's name, then its interfaces' addresses but loopback and IPv6 link-local ones.
std::vector<std::string> names_of_this_machine(const std::string& host) {
  std::vector<std::string> names;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0 && name[0] != '\0') names.emplace_back(name);
  ifaddrs* interfaces = nullptr;
  if (::getifaddrs(&interfaces) != 0) return names;
  for (const ifaddrs* entry = interfaces; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (entry->ifa_addr->sa_family == AF_INET) {
      const in_addr& address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr;
      if ((ntohl(address.s_addr) >> 24) == 127) continue;
      ::inet_ntop(AF_INET, &address, text, sizeof text);
    } else if (entry->ifa_addr->sa_family == AF_INET6 && host == "::") {
      const in6_addr& address = reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr)->sin6_addr;
      if (IN6_IS_ADDR_LOOPBACK(&address) || IN6_IS_ADDR_LINKLOCAL(&address)) continue;
      ::inet_ntop(AF_INET6, &address, text, sizeof text);
    } else {
      continue;
    }
    if (std::find(names.begin(), names.end(), text) == names.end()) names.emplace_back(text);
  }
  ::freeifaddrs(interfaces);
  return names;
}

}  // namespace

int serve_command(int argc, char** argv) {
  const cli::ParsedArguments arguments = cli::parse_arguments(argc, argv, {"--port", "--host"}, {"--no-token"});
  if (!arguments.positional.empty()) throw cli::UsageError("unexpected argument '" + arguments.positional[0] + "'");
  ServeOptions options;
  options.index = cli::command_index();
  if (auto host = arguments.value("--host")) {
    if (host->empty()) throw cli::UsageError("--host needs an address, e.g. 127.0.0.1 or 0.0.0.0");
    options.host = *host;
  }
  options.token = !arguments.has("--no-token");
  if (!options.token && !is_loopback_address(options.host))
    throw cli::UsageError(fmt::format(
        "--no-token is for a loopback --host only: on {} every machine that reaches this one could read the index",
        options.host));
  if (auto port = arguments.value("--port")) {
    const int64_t number = cli::parse_count("--port", *port);
    if (number > 65535) throw cli::UsageError(fmt::format("--port '{}': expected 0 (any free port) to 65535", *port));
    options.port = static_cast<int>(number);
  }
  // Checks the index before listening: a missing or damaged index is the same error as `runner show` gives.
  index::open_index_for_reading(options.index);

  // The signals that stop serving are taken by one thread (sigwait), which the server's threads inherit blocked.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop_signals, signal);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  DashboardServer server(options);
  server.bind();
  // On every address: a URL by this machine's name, then one per address (a browser cannot open 0.0.0.0's).
  const std::vector<std::string> names =
      is_any_address(options.host) ? names_of_this_machine(options.host) : std::vector<std::string>{};
  if (names.empty()) std::printf("runner serve: %s\n", server.url().c_str());
  for (std::size_t i = 0; i < names.size(); ++i)
    std::printf("runner serve: %s%s\n", i == 0 ? "" : "or ", server.url(names[i]).c_str());
  if (server.token().empty())
    std::printf("runner serve: --no-token: every user of this machine can read the dashboard\n");
  else if (is_loopback_address(options.host))
    std::printf("runner serve: requests need the token in the URL above (opening it sets a cookie)\n");
  else
    std::printf(
        "runner serve: listening on %s, which other machines may reach: requests need the token in the URL above "
        "(opening it sets a cookie)\n",
        options.host.c_str());
  if (options.index.url.empty())
    std::printf("runner serve: the index in %s, read-only; Ctrl-C stops\n", options.index.home.c_str());
  else
    std::printf("runner serve: the index at %s (run folders in %s), read-only; Ctrl-C stops\n",
                options.index.shown().c_str(), options.index.home.c_str());
  std::fflush(stdout);
  std::thread stopper([&] {
    int signal = 0;
    sigwait(&stop_signals, &signal);
    server.stop();
  });
  server.run();
  pthread_kill(stopper.native_handle(), SIGTERM);  // when run() ended by itself; sigwait takes it either way
  stopper.join();
  std::printf("runner serve: stopped\n");
  return 0;
}

int run_serve_command(int argc, char** argv) { return cli::run_reporting_errors("serve", serve_command, argc, argv); }

}  // namespace runner::serve
