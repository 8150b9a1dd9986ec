"""Audit: the security events every flow records (with their alerts), and the attack report."""
