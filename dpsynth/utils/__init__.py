"""Small helpers shared across dpsynth."""
