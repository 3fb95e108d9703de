"""What serves a request once it is admitted: routing to a model through the registry
(with fallbacks), the capability checks, the generation and embedding calls, and the
chat-shaped bodies and frames they produce."""
