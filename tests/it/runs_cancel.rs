//! runs cancel (placeholder until written)
