// The trees the tree algorithms run over, as functions of a rank's position, so that every rank
// computes its own parent and children without talking to anyone.
#pragma once

namespace ringreduce::algorithms {

struct TreeNode {
  int parent = -1;  // -1: the root
  int child[2] = {-1, -1};
  int children() const { return (child[0] >= 0) + (child[1] >= 0); }
};

// A balanced binary tree over positions 0..n-1 in in-order layout: position p with lowest set bit
// b sits at height lg b, its children are p - b/2 and p + b/2 (the right one moved down to
// p + b/4, p + b/8, ... while it falls outside 0..n-1), and its parent is (p ^ b) | 2b, or p ^ b
// when that falls outside. Position 0 is the root, with the single child 2^ceil(lg n)/2. Odd
// positions are the leaves: about half of the nodes, which is what lets two such trees be
// arranged so that each rank is a leaf in one of them (binary_tree_mirror).
TreeNode binary_tree(int n, int p);

// NCCL's double binary tree: the second tree's position of rank r. For even n the mirror
// n-1-r (odd ranks, leaves of the first tree, become even positions, inner nodes); for odd n a
// shift by one (r-1), which does the same for every rank but rank 0, inner in both.
int second_tree_position(int n, int r);
int second_tree_rank(int n, int p);

// The binomial tree rooted at virtual rank 0 (virtual rank = (rank - root) mod n): v receives from
// v - lowbit(v) and sends to v + 2^k for every 2^k < lowbit(v) (every 2^k < n at the root) with
// v + 2^k < n. Depth ceil(lg n); the root has the most children.
int binomial_parent(int v);  // -1 for v = 0
// Calls fn(child) for v's children, largest subtree first (the order a broadcast sends in, so
// that the deepest subtree starts first).
template <typename Fn>
void binomial_children(int n, int v, Fn&& fn) {
  int top = 1;
  while (top < n) top <<= 1;
  const int low = v == 0 ? top : (v & -v);
  for (int m = low >> 1; m > 0; m >>= 1)
    if (v + m < n) fn(v + m);
}

}  // namespace ringreduce::algorithms
