// The tree shapes: every tree spans all ranks once with parent and child links agreeing, depths
// stay logarithmic, and the double binary tree makes each rank a leaf in one of its two trees.
#include <gtest/gtest.h>

#include <vector>

#include "algorithms/tree_shape.h"

namespace ringreduce::algorithms {
namespace {

// Checks the tree given as parent/children functions over 0..n-1 rooted at 0; returns its depth.
template <typename Parent, typename Children>
int check_tree(int n, Parent parent, Children children) {
  std::vector<int> depth(static_cast<size_t>(n), -1);
  depth[0] = 0;
  EXPECT_EQ(parent(0), -1);
  // Visit from the root; each node must be reached exactly once, from its parent.
  std::vector<int> todo = {0};
  int reached = 1, deepest = 0;
  while (!todo.empty()) {
    const int p = todo.back();
    todo.pop_back();
    for (int c : children(p)) {
      EXPECT_GE(c, 0);
      EXPECT_LT(c, n);
      if (c < 0 || c >= n) continue;
      EXPECT_EQ(depth[static_cast<size_t>(c)], -1) << "n=" << n << " node " << c << " twice";
      EXPECT_EQ(parent(c), p) << "n=" << n << " child " << c << " of " << p;
      depth[static_cast<size_t>(c)] = depth[static_cast<size_t>(p)] + 1;
      deepest = std::max(deepest, depth[static_cast<size_t>(c)]);
      ++reached;
      todo.push_back(c);
    }
  }
  EXPECT_EQ(reached, n) << "n=" << n;
  return deepest;
}

int ceil_lg(int n) {
  int lg = 0;
  while ((1 << lg) < n) ++lg;
  return lg;
}

TEST(TreeShape, BinaryTreeSpansEveryPositionWithLogDepth) {
  for (int n = 1; n <= 200; ++n) {
    const int depth = check_tree(
        n, [&](int p) { return binary_tree(n, p).parent; },
        [&](int p) {
          std::vector<int> c;
          for (int x : binary_tree(n, p).child)
            if (x >= 0) c.push_back(x);
          return c;
        });
    EXPECT_LE(depth, ceil_lg(n)) << "n=" << n;
  }
}

TEST(TreeShape, DoubleBinaryTreeMakesEveryRankButOneALeafOnce) {
  for (int n = 2; n <= 200; ++n) {
    int inner_in_both = 0;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(second_tree_rank(n, second_tree_position(n, r)), r);
      const bool inner0 = binary_tree(n, r).children() > 0;
      const bool inner1 = binary_tree(n, second_tree_position(n, r)).children() > 0;
      inner_in_both += inner0 && inner1;
    }
    // Even n: none; odd n: rank 0 only (the first tree's root maps onto an inner position).
    EXPECT_LE(inner_in_both, n % 2) << "n=" << n;
  }
}

TEST(TreeShape, BinomialTreeSpansEveryRankWithLogDepth) {
  for (int n = 1; n <= 200; ++n) {
    const int depth = check_tree(n, binomial_parent, [&](int v) {
      std::vector<int> c;
      binomial_children(n, v, [&](int x) { c.push_back(x); });
      return c;
    });
    // floor(lg n) levels; the root's sends take ceil(lg n) rounds.
    EXPECT_EQ(depth, ceil_lg(n + 1) - 1) << "n=" << n;
  }
}

}  // namespace
}  // namespace ringreduce::algorithms
