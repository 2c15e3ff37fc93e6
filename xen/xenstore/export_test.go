package xenstore

// TransactionRetries is transactionRetries, for the external tests.
const TransactionRetries = transactionRetries
