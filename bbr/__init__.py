"""Body-based router: copies routing fields from the JSON body into headers so Envoy's route
table (what an HTTPRoute compiles to) can pick the inference pool."""
