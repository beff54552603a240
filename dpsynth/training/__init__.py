"""What the methods share to train: the run context a method's ``fit`` gets, a resumable DP-SGD phase, the
non-private warm-up phases, the generator fitted to Fourier-feature means, and the probes the planner times."""
