//! AWS errors as [`CloudError`]s: throttling becomes [`CloudError::Throttled`] (after the SDK's
//! own retries gave up), network trouble and 5xx become [`CloudError::Transient`], everything
//! else keeps its AWS error code in a [`CloudError::Permanent`] text.

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use ccm_cloud::CloudError;

/// AWS error codes that mean "slow down" (EC2 says `RequestLimitExceeded`, ELB `Throttling`).
pub const THROTTLE_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "TooManyRequestsException",
    "RequestThrottled",
];

/// AWS error codes for failures on AWS's side that go away by themselves.
const TRANSIENT_CODES: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "RequestTimeout",
];

/// The AWS error code of a failed call, if AWS sent one.
pub fn code<E, R>(err: &SdkError<E, R>) -> Option<&str>
where
    E: ProvideErrorMetadata,
{
    match err {
        SdkError::ServiceError(e) => e.err().code(),
        _ => None,
    }
}

/// Maps a failed SDK call of `request` (the AWS action name) to a [`CloudError`].
pub fn map<E, R>(request: &str, err: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug + Send + Sync + 'static,
{
    if let SdkError::ServiceError(se) = &err {
        let code = se.err().code().unwrap_or("Unknown");
        let message = se.err().message().unwrap_or("");
        let text = format!("{request}: {code}: {message}");
        if THROTTLE_CODES.contains(&code) {
            return CloudError::Throttled {
                message: text,
                retry_after: None,
            };
        }
        if TRANSIENT_CODES.contains(&code) {
            return CloudError::Transient(text);
        }
        return CloudError::Permanent(text);
    }
    let text = format!("{request}: {}", DisplayErrorContext(&err));
    match err {
        SdkError::ConstructionFailure(_) => CloudError::Permanent(text),
        _ => CloudError::Transient(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::error::{ConnectorError, ErrorMetadata};
    use aws_sdk_ec2::operation::describe_instances::DescribeInstancesError;

    fn service(code: &str) -> SdkError<DescribeInstancesError, ()> {
        let meta = ErrorMetadata::builder()
            .code(code)
            .message("details")
            .build();
        SdkError::service_error(DescribeInstancesError::generic(meta), ())
    }

    #[test]
    fn throttling_codes_become_throttled() {
        for code in ["RequestLimitExceeded", "Throttling", "ThrottlingException"] {
            let e = map("DescribeInstances", service(code));
            assert!(e.is_throttled(), "{code}: {e:?}");
            assert!(
                e.to_string()
                    .contains(&format!("DescribeInstances: {code}: details")),
                "{e}"
            );
        }
    }

    #[test]
    fn other_codes_keep_their_code() {
        let e = map("DescribeInstances", service("UnauthorizedOperation"));
        assert_eq!(
            e,
            CloudError::Permanent("DescribeInstances: UnauthorizedOperation: details".into())
        );
        assert!(matches!(
            map("DescribeInstances", service("InternalError")),
            CloudError::Transient(_)
        ));
        assert_eq!(
            code(&service("InvalidInstanceID.NotFound")),
            Some("InvalidInstanceID.NotFound")
        );
    }

    #[test]
    fn network_failures_are_transient() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e: SdkError<DescribeInstancesError, ()> =
            SdkError::dispatch_failure(ConnectorError::io(Box::new(io)));
        assert!(
            matches!(map("DescribeInstances", e), CloudError::Transient(m) if m.starts_with("DescribeInstances: "))
        );
    }
}
