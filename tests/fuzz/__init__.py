"""The fuzz suite: property-based tests (Hypothesis) that feed every ``mcfl`` entry point hostile
inputs and check the package's promises (docs/reliability.md, "What the package promises")."""
