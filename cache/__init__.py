"""Per-device store of native code and tuning results, keyed so no device gets another's entry."""
