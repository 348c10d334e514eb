"""The Wyoming door: ``handler`` serves one connection's events, ``wire`` reads them strictly,
``discovery`` announces the service over zeroconf (mDNS)."""
