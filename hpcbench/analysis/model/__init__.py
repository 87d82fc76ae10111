"""The performance model: collectives, exchanges, contention, fit, prediction, forecasts, validation."""
