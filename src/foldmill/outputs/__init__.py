"""Prediction outputs: mmCIF and confidence files, run summary, confidence filters, export, report."""
