#include "algorithms/tree_shape.h"

#include <algorithm>

#include "algorithms/cost.h"

namespace ringreduce::algorithms {

TreeNode binary_tree(int n, int p) {
  TreeNode t;
  if (n <= 1) return t;
  int top = 1;
  while (top < n) top <<= 1;
  // The root behaves as a node whose lowest bit is `top`, with no left subtree.
  const int low = p == 0 ? top : (p & -p);
  if (p != 0) {
    const int up = (p ^ low) | (low << 1);
    t.parent = up < n ? up : (p ^ low);
  }
  int half = low >> 1;
  if (half > 0) {
    if (p != 0) t.child[0] = p - half;
    while (half > 0 && p + half >= n) half >>= 1;
    if (half > 0) t.child[1] = p + half;
  }
  return t;
}

int second_tree_position(int n, int r) {
  return n % 2 == 0 ? n - 1 - r : (r + n - 1) % n;
}
int second_tree_rank(int n, int p) {
  return n % 2 == 0 ? n - 1 - p : (p + 1) % n;
}

int binomial_parent(int v) {
  return v == 0 ? -1 : v - (v & -v);
}

int tree_depth(int n) {
  int depth = 0;
  for (int p = 0; p < n; ++p) {
    int d = 0;
    for (int q = p; q != 0; q = binary_tree(n, q).parent) ++d;
    depth = std::max(depth, d);
  }
  return depth;
}

}  // namespace ringreduce::algorithms
