// Tests of runtime/data/batch_order: the seeded per-epoch shuffles and each rank's share of every batch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <utility>
#include <set>
#include <vector>

#include "runtime/data/batch_order.h"

using runner::data::BatchOrder;
using runner::data::BatchOrderOptions;
using Indices = std::vector<std::int64_t>;

namespace {

BatchOrder order_of(std::int64_t size, std::int64_t batch, std::int64_t rank = 0, std::int64_t world = 1,
                    bool shuffle = true, bool drop_last = false) {
  return BatchOrder(BatchOrderOptions{size, batch, rank, world, shuffle, drop_last});
}

}  // namespace

TEST_CASE("an epoch's shuffle is a permutation fixed by (seed, epoch)", "[data]") {
  const Indices order = BatchOrder::permutation(7, 0, 1000);
  Indices sorted = order;
  std::sort(sorted.begin(), sorted.end());
  Indices identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(sorted == identity);
  CHECK(order != identity);
  CHECK(BatchOrder::permutation(7, 0, 1000) == order);
  CHECK(BatchOrder::permutation(7, 1, 1000) != order);
  CHECK(BatchOrder::permutation(8, 0, 1000) != order);
  // The order is part of what a checkpoint continues: a change here would make resumed runs read other samples.
  CHECK(BatchOrder::permutation(0, 0, 8) == Indices{1, 3, 4, 5, 6, 2, 7, 0});
}

TEST_CASE("every sample is read once per epoch, and the next epoch reads another order", "[data]") {
  const BatchOrder order = order_of(10, 4);
  REQUIRE(order.batches_per_epoch() == 3);
  Indices epoch0, epoch1;
  for (int position = 0; position < 3; ++position) {
    const Indices batch = order.indices(5, position);
    CHECK(batch.size() == (position < 2 ? 4u : 2u));
    epoch0.insert(epoch0.end(), batch.begin(), batch.end());
    const Indices next = order.indices(5, position + 3);
    epoch1.insert(epoch1.end(), next.begin(), next.end());
  }
  CHECK(epoch0 == BatchOrder::permutation(5, 0, 10));
  CHECK(epoch1 == BatchOrder::permutation(5, 1, 10));
  // Without shuffle, the dataset's order.
  CHECK(order_of(10, 4, 0, 1, false).indices(5, 1) == Indices{4, 5, 6, 7});
  // drop_last leaves out the partial batch: position 2 is the next epoch's first.
  const BatchOrder dropping = order_of(10, 4, 0, 1, true, true);
  REQUIRE(dropping.batches_per_epoch() == 2);
  const Indices next_epoch = BatchOrder::permutation(5, 1, 10);
  CHECK(dropping.indices(5, 2) == Indices(next_epoch.begin(), next_epoch.begin() + 4));
}

TEST_CASE("the ranks' parts of a batch, in rank order, are the one-process batch", "[data]") {
  // The last batch of 40 holds 4 samples: split 2 + 2 or 1 + 1 + 2 (fewer samples than ranks: the next test).
  for (const auto& [size, world] : std::vector<std::pair<std::int64_t, std::int64_t>>{{40, 2}, {40, 3}, {42, 6}}) {
    const BatchOrder single = order_of(size, 6);
    for (std::int64_t position = 0; position < 2 * single.batches_per_epoch(); ++position) {
      Indices joined;
      for (std::int64_t rank = 0; rank < world; ++rank) {
        const Indices part = order_of(size, 6, rank, world).indices(11, position);
        joined.insert(joined.end(), part.begin(), part.end());
      }
      CHECK(joined == single.indices(11, position));
    }
  }
}

TEST_CASE("a partial last batch is split as evenly as it goes; a rank left without a sample repeats one", "[data]") {
  // 10 samples in batches of 4 over 4 ranks: the last batch holds samples 8 and 9.
  std::vector<Indices> parts;
  for (std::int64_t rank = 0; rank < 4; ++rank) parts.push_back(order_of(10, 4, rank, 4, false).indices(0, 2));
  CHECK(parts == std::vector<Indices>{{0}, {8}, {2}, {9}});
  // Over 2 ranks each takes one.
  CHECK(order_of(10, 4, 0, 2, false).indices(0, 2) == Indices{8});
  CHECK(order_of(10, 4, 1, 2, false).indices(0, 2) == Indices{9});
}

TEST_CASE("a batch that does not split over the ranks, or no full batch, is refused with the numbers", "[data]") {
  CHECK_THROWS_WITH(order_of(10, 5, 0, 2),
                    "loader: batch 5 (the global batch of all ranks) does not split evenly over 2 ranks");
  CHECK_THROWS_WITH(order_of(3, 4, 0, 1, true, true), "loader: 3 samples make no full batch of 4 with drop_last");
  CHECK(order_of(3, 4).batches_per_epoch() == 1);
}
