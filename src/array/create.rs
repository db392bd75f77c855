//! placeholder until the format layer's create plan lands
