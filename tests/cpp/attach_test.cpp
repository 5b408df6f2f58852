// Tests of runtime/attach: the message framing, and the socket's two ends in one process (the server never waits).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "runtime/attach/attach_protocol.h"
#include "runtime/attach/attach_socket.h"
#include "tests/cpp/temp_directory.h"

using runner::attach::AttachClient;
using runner::attach::AttachError;
using runner::attach::AttachServer;
using runner::attach::encode_message;
using runner::attach::Message;
using runner::attach::MessageReader;
using runner::attach::ProtocolError;

TEST_CASE("attach messages come whole whatever pieces the bytes arrive in", "[attach]") {
  const std::string bytes = encode_message({"eval", "print(1)\n"}) + encode_message({"done", ""}) +
                            encode_message({"output", std::string("a\0b", 3)});
  CHECK(bytes.substr(0, 7) == "eval 9\n");
  MessageReader reader;
  std::vector<Message> messages;
  for (char c : bytes) {
    reader.feed(&c, 1);
    while (std::optional<Message> message = reader.next()) messages.push_back(*message);
  }
  REQUIRE(messages.size() == 3);
  CHECK(messages[0].kind == "eval");
  CHECK(messages[0].text == "print(1)\n");
  CHECK(messages[1].kind == "done");
  CHECK(messages[1].text.empty());
  CHECK(messages[2].text == std::string("a\0b", 3));
}

TEST_CASE("a malformed attach header is an error that says what it got", "[attach]") {
  MessageReader reader;
  const std::string bad = "Eval x\n";
  reader.feed(bad.data(), bad.size());
  CHECK_THROWS_WITH(reader.next(), "bad message header 'Eval x' (expected 'KIND LENGTH')");
  MessageReader huge;
  const std::string over = "eval 99999999999\n";
  huge.feed(over.data(), over.size());
  CHECK_THROWS_AS(huge.next(), ProtocolError);
  CHECK_THROWS_AS(encode_message({"", "x"}), ProtocolError);
}

TEST_CASE("an attach message of the limit's size passes whole and one byte more is refused", "[attach]") {
  using runner::attach::kMaxMessageBytes;
  const std::string most(kMaxMessageBytes, 'o');
  MessageReader reader;
  const std::string bytes = encode_message({"output", most});
  reader.feed(bytes.data(), bytes.size());
  const std::optional<Message> message = reader.next();
  REQUIRE(message.has_value());
  CHECK(message->text.size() == kMaxMessageBytes);
  CHECK_THROWS_WITH(encode_message({"output", most + "o"}),
                    "a output message of 67108865 bytes is over the limit of 67108864");
  MessageReader over;
  const std::string header = "output 67108865\n";
  over.feed(header.data(), header.size());
  CHECK_THROWS_WITH(over.next(), "a output message of 67108865 bytes is over the limit of 67108864");
}

TEST_CASE("the attach socket is the owner's, answers one client and goes with the server", "[attach]") {
  runner::testing::TempDir run_directory("attach");
  std::string path;
  {
    AttachServer server(run_directory.path, [] { return std::string("attached to run test"); });
    path = server.socket_path();
    CHECK(path == run_directory.path + "/attach/socket");
    struct stat status {};
    REQUIRE(::stat(path.c_str(), &status) == 0);
    CHECK((status.st_mode & 0777) == 0600);
    REQUIRE(::stat((run_directory.path + "/attach").c_str(), &status) == 0);
    CHECK((status.st_mode & 0777) == 0700);
    CHECK_FALSE(server.poll());  // nobody: no wait

    AttachClient client(path);
    CHECK_FALSE(server.poll());  // accepted and greeted; no request yet
    CHECK(server.has_client());
    std::optional<Message> hello = client.receive();
    REQUIRE(hello);
    CHECK(hello->kind == "hello");
    CHECK(hello->text == "attached to run test");

    AttachClient second(path);
    CHECK_FALSE(server.poll());
    std::optional<Message> busy = second.receive();
    REQUIRE(busy);
    CHECK(busy->kind == "busy");
    CHECK_FALSE(second.receive());  // closed

    client.send({"eval", "=1 + 1"});
    std::optional<Message> request = server.poll();
    REQUIRE(request);
    CHECK(request->kind == "eval");
    CHECK(request->text == "=1 + 1");
    server.send({"output", "2\n"});
    server.send({"done", ""});
    CHECK(client.receive()->text == "2\n");
    CHECK(client.receive()->kind == "done");

    client.send({"detach", ""});
    CHECK_FALSE(server.poll());
    CHECK_FALSE(server.has_client());

    AttachClient again(path);
    CHECK_FALSE(server.poll());
    CHECK(again.receive()->kind == "hello");
    server.close("the run ended (finished)");
    std::optional<Message> ended = again.receive();
    REQUIRE(ended);
    CHECK(ended->kind == "ended");
    CHECK(ended->text == "the run ended (finished)");
    CHECK_FALSE(again.receive());
  }
  struct stat status {};
  CHECK(::stat(path.c_str(), &status) != 0);
  CHECK(::stat((run_directory.path + "/attach").c_str(), &status) != 0);
  CHECK_THROWS_AS(AttachClient(path), AttachError);
}

TEST_CASE(
    "an interrupt sent with its chunk is waiting before the chunk runs, and an answer read with another is there at "
    "once",
    "[attach]") {
  runner::testing::TempDir run_directory("attach");
  AttachServer server(run_directory.path, [] { return std::string("attached"); });
  AttachClient client(server.socket_path());
  CHECK_FALSE(server.poll());
  CHECK(client.receive()->kind == "hello");

  client.send({"eval", "while true do end"});
  client.send({"interrupt", ""});
  std::optional<Message> request = server.poll();
  REQUIRE(request);
  CHECK(request->kind == "eval");
  CHECK(server.interrupt_waiting());
  CHECK(server.poll()->kind == "interrupt");
  CHECK_FALSE(server.interrupt_waiting());

  server.send({"output", "x"});
  server.send({"done", ""});
  REQUIRE(client.wait_readable(5));
  CHECK(client.receive()->kind == "output");
  CHECK(client.wait_readable(0));  // came in the same read as the output
  CHECK(client.receive()->kind == "done");
}

TEST_CASE("a client silent for the idle timeout is told why and dropped, and the session is free", "[attach]") {
  runner::testing::TempDir run_directory("attach");
  AttachServer server(
      run_directory.path, [] { return std::string("attached"); }, 1.0);
  AttachClient silent(server.socket_path());
  CHECK_FALSE(server.poll());
  CHECK(silent.receive()->kind == "hello");
  for (int tries = 0; tries < 1000 && server.has_client(); ++tries) {
    CHECK_FALSE(server.poll());
    silent.wait_readable(0.01);
  }
  REQUIRE_FALSE(server.has_client());
  std::optional<Message> notice = silent.receive();
  REQUIRE(notice);
  CHECK(notice->kind == "disconnected");
  CHECK(notice->text ==
        "runner attach: disconnected after 1s without a request (RUNNER_ATTACH_IDLE_TIMEOUT), so that another "
        "session can attach; the run goes on");
  CHECK_FALSE(silent.receive());  // closed

  AttachClient next(server.socket_path());
  CHECK_FALSE(server.poll());
  CHECK(next.receive()->kind == "hello");
}

TEST_CASE("a run folder past the length of a socket address still gets its socket", "[attach]") {
  runner::testing::TempDir root("attach");
  const std::string deep = root.path + "/" + std::string(60, 'a') + "/" + std::string(60, 'b');
  REQUIRE(::mkdir((root.path + "/" + std::string(60, 'a')).c_str(), 0700) == 0);
  REQUIRE(::mkdir(deep.c_str(), 0700) == 0);
  AttachServer server(deep, [] { return std::string("deep"); });
  AttachClient client(server.socket_path());
  CHECK_FALSE(server.poll());
  CHECK(client.receive()->text == "deep");
}
