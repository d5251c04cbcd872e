"""Network pieces shared by the upstream links and the state store: TLS and egress proxies."""
