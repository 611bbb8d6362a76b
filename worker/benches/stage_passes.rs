//! Benchmark of F, B and W per block (filled in below).

fn main() {}
