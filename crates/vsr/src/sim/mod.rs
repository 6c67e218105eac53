//! The deterministic simulator's parts (design: `docs/replication.md`, "Simulator").
