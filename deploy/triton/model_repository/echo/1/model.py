"""Echo: RESPONSE is PROMPT, byte for byte. No third-party imports besides numpy."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            out = pb_utils.Tensor("RESPONSE", np.array(prompt, dtype=np.object_))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
