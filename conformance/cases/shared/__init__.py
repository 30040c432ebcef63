"""What the case kinds share: the training loop and its reference, state read-back, the checks, the Hypothesis budgets, the transparency observer and the numeric constants."""
