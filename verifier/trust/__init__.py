"""Who signed: bundles, signatures against keys and authorities, X.509 and keyless identities, timestamps."""
