"""Data: dataset readers (`sources`) and the seeded, stratified split into train / validation / test (`splits`)."""
